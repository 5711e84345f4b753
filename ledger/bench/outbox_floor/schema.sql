-- The least an outbox can be and still record each delivery (scripts/outbox-floor.sh): a
-- job row with its due time, its lease and its end, an index of open work, and an attempt
-- row per delivery. None of payonce's other columns, checks or indexes (its event, its
-- endpoint, one delivery per endpoint, the throttles); every one of them in the floor's
-- favour. Filled as payonce's outbox is (fillfactor 70, so a claim can stay on its page).
DROP TABLE IF EXISTS floor_attempts;
DROP TABLE IF EXISTS floor_outbox;
CREATE TABLE floor_outbox (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    due_at      TIMESTAMPTZ NOT NULL,
    done_at     TIMESTAMPTZ,
    attempts    INTEGER NOT NULL DEFAULT 0,
    lease_until TIMESTAMPTZ,
    leased_by   TEXT
) WITH (fillfactor = 70);
CREATE INDEX floor_outbox_open ON floor_outbox (due_at, id) WHERE done_at IS NULL;
CREATE TABLE floor_attempts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      BIGINT NOT NULL,
    attempt     INTEGER NOT NULL,
    status      INTEGER,
    created_at  TIMESTAMPTZ NOT NULL,
    duration_ms BIGINT NOT NULL
);
CREATE INDEX floor_attempts_of_job ON floor_attempts (job_id, attempt);
INSERT INTO floor_outbox (due_at)
SELECT now() - interval '1 hour' + n * interval '1 microsecond' FROM generate_series(1, :jobs) AS n;
VACUUM ANALYZE floor_outbox;
