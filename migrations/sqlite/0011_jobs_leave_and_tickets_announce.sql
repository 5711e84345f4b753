-- As migrations/postgres/0013 says: a payout's job is deleted when it settles, its claims
-- kept on the payout; a delivery's attempts go with it when the reaper deletes it; and an
-- outcome's event is its ticket — a delivery names its event by id (an `events` row's or
-- an announcing ticket's) and carries its type. SQLite cannot change a table's
-- constraints in place, so `outbox` and `webhook_attempts` are rebuilt (rows, ids and the
-- id sequence kept): the attempts first, so that dropping the old outbox deletes nothing
-- through them.
ALTER TABLE payouts
    ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0
        CONSTRAINT payouts_attempts_non_negative CHECK (attempts >= 0);

DROP TRIGGER payouts_settle_once;
UPDATE payouts
SET attempts = (SELECT o.attempts FROM outbox o WHERE o.payout_id = payouts.id)
WHERE status <> 'pending' AND EXISTS (SELECT 1 FROM outbox o WHERE o.payout_id = payouts.id);
CREATE TRIGGER payouts_settle_once BEFORE UPDATE ON payouts
WHEN OLD.status <> 'pending'
BEGIN
    SELECT RAISE(ABORT, 'a payout is settled once');
END;

DELETE FROM outbox WHERE kind = 'payout' AND done_at IS NOT NULL;

CREATE TEMPORARY TABLE attempts_kept AS SELECT * FROM webhook_attempts;
DROP TABLE webhook_attempts;

CREATE TABLE outbox_lean (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL CONSTRAINT outbox_kind_known CHECK (kind IN ('payout', 'webhook')),
    payout_id   BLOB CONSTRAINT outbox_one_job_per_payout UNIQUE REFERENCES payouts (id),
    event_id    BLOB,
    endpoint_id BLOB REFERENCES webhook_endpoints (id),
    event_type  TEXT
                CONSTRAINT outbox_event_type_known
                CHECK (event_type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                                      'order.paid', 'payout.succeeded', 'payout.failed')),
    due_at      INTEGER NOT NULL,
    lease_until INTEGER,
    leased_by   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0 CONSTRAINT outbox_attempts_non_negative CHECK (attempts >= 0),
    throttled   INTEGER NOT NULL DEFAULT 0
                CONSTRAINT outbox_throttled_within_attempts
                CHECK (throttled >= 0 AND throttled <= attempts),
    last_error  TEXT,
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    outcome     TEXT
                CONSTRAINT outbox_outcome_known
                CHECK (outcome IN ('delivered', 'exhausted', 'endpoint-disabled', 'endpoint-deleted')),
    CONSTRAINT outbox_payout_iff_kind CHECK ((kind = 'payout') = (payout_id IS NOT NULL)),
    CONSTRAINT outbox_webhook_iff_kind
        CHECK ((kind = 'webhook')
               = (event_id IS NOT NULL AND endpoint_id IS NOT NULL AND event_type IS NOT NULL)),
    CONSTRAINT outbox_outcome_only_for_webhooks_once_done
        CHECK (outcome IS NULL OR (kind = 'webhook' AND done_at IS NOT NULL)),
    CONSTRAINT outbox_webhook_done_iff_outcome
        CHECK (kind <> 'webhook' OR (done_at IS NULL) = (outcome IS NULL)),
    CONSTRAINT outbox_one_delivery_per_endpoint UNIQUE (event_id, endpoint_id)
);

INSERT INTO outbox_lean (id, kind, payout_id, event_id, endpoint_id, event_type, due_at,
                         lease_until, leased_by, attempts, throttled, last_error, created_at,
                         done_at, outcome)
SELECT o.id, o.kind, o.payout_id, o.event_id, o.endpoint_id,
       (SELECT e.type FROM events e WHERE e.id = o.event_id), o.due_at, o.lease_until,
       o.leased_by, o.attempts, o.throttled, o.last_error, o.created_at, o.done_at, o.outcome
FROM outbox o;

-- An id once handed out is never handed out again, deleted or not.
DELETE FROM sqlite_sequence WHERE name = 'outbox_lean';
INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox_lean', seq FROM sqlite_sequence WHERE name = 'outbox';

DROP TABLE outbox;
ALTER TABLE outbox_lean RENAME TO outbox;

CREATE INDEX outbox_due ON outbox (kind, due_at, id) WHERE done_at IS NULL;
CREATE INDEX outbox_by_endpoint ON outbox (endpoint_id, id) WHERE endpoint_id IS NOT NULL;

CREATE TABLE webhook_attempts (
    job_id          INTEGER NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    attempt         INTEGER NOT NULL,
    recorded_at     INTEGER NOT NULL,
    duration_ms     INTEGER NOT NULL,
    response_status INTEGER,
    error           TEXT,
    response_body   TEXT,
    PRIMARY KEY (job_id, attempt)
);
INSERT INTO webhook_attempts SELECT * FROM attempts_kept;
DROP TABLE attempts_kept;

INSERT INTO ledger_marks (name, at)
VALUES ('outcome_events', CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER));
