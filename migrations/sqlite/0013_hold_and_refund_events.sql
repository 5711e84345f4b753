-- As migrations/postgres/0016 says: the lists of known event types grow by `hold.captured`,
-- `hold.voided`, `hold.expired` and `refund.succeeded`. SQLite cannot change a table's
-- constraints in place, so `events` and `outbox` are rebuilt (rows, ids and the id
-- sequence kept), the outbox as migration 0011 rebuilt it: its attempts first, so that
-- dropping the old outbox deletes nothing through them.
CREATE TABLE events_typed (
    id         BLOB PRIMARY KEY NOT NULL,
    account_id BLOB NOT NULL REFERENCES accounts (id),
    type       TEXT NOT NULL
               CONSTRAINT events_type_known
               CHECK (type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                               'order.paid', 'payout.succeeded', 'payout.failed',
                               'hold.captured', 'hold.voided', 'hold.expired',
                               'refund.succeeded')),
    ticket_id  BLOB NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
INSERT INTO events_typed (id, account_id, type, ticket_id, data, created_at)
SELECT id, account_id, type, ticket_id, data, created_at FROM events;
DROP TABLE events;
ALTER TABLE events_typed RENAME TO events;
CREATE UNIQUE INDEX events_once_per_ticket ON events (ticket_id, type);

CREATE TEMPORARY TABLE attempts_kept AS SELECT * FROM webhook_attempts;
DROP TABLE webhook_attempts;

CREATE TABLE outbox_typed (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL CONSTRAINT outbox_kind_known CHECK (kind IN ('payout', 'webhook')),
    payout_id   BLOB CONSTRAINT outbox_one_job_per_payout UNIQUE REFERENCES payouts (id),
    event_id    BLOB,
    endpoint_id BLOB REFERENCES webhook_endpoints (id),
    event_type  TEXT
                CONSTRAINT outbox_event_type_known
                CHECK (event_type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                                      'order.paid', 'payout.succeeded', 'payout.failed',
                                      'hold.captured', 'hold.voided', 'hold.expired',
                                      'refund.succeeded')),
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

INSERT INTO outbox_typed (id, kind, payout_id, event_id, endpoint_id, event_type, due_at,
                          lease_until, leased_by, attempts, throttled, last_error, created_at,
                          done_at, outcome)
SELECT id, kind, payout_id, event_id, endpoint_id, event_type, due_at, lease_until, leased_by,
       attempts, throttled, last_error, created_at, done_at, outcome
FROM outbox;

-- An id once handed out is never handed out again, deleted or not.
DELETE FROM sqlite_sequence WHERE name = 'outbox_typed';
INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox_typed', seq FROM sqlite_sequence WHERE name = 'outbox';

DROP TABLE outbox;
ALTER TABLE outbox_typed RENAME TO outbox;

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
