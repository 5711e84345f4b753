-- The same as migrations/postgres/0009_webhooks.sql, in SQLite's types and syntax. SQLite
-- cannot change a table's constraints in place, so `outbox` is rebuilt with the new columns
-- and kinds (its rows and ids kept).

CREATE TABLE webhook_endpoints (
    id                      BLOB PRIMARY KEY NOT NULL,
    account_id              BLOB NOT NULL REFERENCES accounts (id),
    url                     TEXT NOT NULL
                            CONSTRAINT webhook_endpoints_url_length CHECK (length(url) BETWEEN 1 AND 2048),
    event_types             TEXT NOT NULL,
    secret_sealed           BLOB NOT NULL,
    previous_secret_sealed  BLOB,
    previous_secret_until   INTEGER,
    disabled_at             INTEGER,
    disabled_reason         TEXT,
    deleted_at              INTEGER,
    created_at              INTEGER NOT NULL,
    CONSTRAINT webhook_endpoints_previous_with_until
        CHECK ((previous_secret_sealed IS NULL) = (previous_secret_until IS NULL)),
    CONSTRAINT webhook_endpoints_disabled_with_reason
        CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL))
);

CREATE INDEX webhook_endpoints_by_account ON webhook_endpoints (account_id, created_at, id);

CREATE TABLE webhook_subscriptions (
    account_id  BLOB NOT NULL,
    event_type  TEXT NOT NULL,
    endpoint_id BLOB NOT NULL REFERENCES webhook_endpoints (id),
    PRIMARY KEY (account_id, event_type, endpoint_id)
);

CREATE TABLE sealing_keys (
    name       TEXT PRIMARY KEY NOT NULL,
    key        BLOB NOT NULL CONSTRAINT sealing_keys_length CHECK (length(key) = 32),
    created_at INTEGER NOT NULL
);

CREATE TABLE events (
    id         BLOB PRIMARY KEY NOT NULL,
    account_id BLOB NOT NULL REFERENCES accounts (id),
    type       TEXT NOT NULL
               CONSTRAINT events_type_known
               CHECK (type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                               'order.paid', 'payout.succeeded', 'payout.failed')),
    ticket_id  BLOB NOT NULL,
    data       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE UNIQUE INDEX events_once_per_ticket ON events (ticket_id, type);

CREATE TABLE outbox_with_webhooks (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL CONSTRAINT outbox_kind_known CHECK (kind IN ('payout', 'webhook')),
    payout_id   BLOB CONSTRAINT outbox_one_job_per_payout UNIQUE REFERENCES payouts (id),
    event_id    BLOB REFERENCES events (id),
    endpoint_id BLOB REFERENCES webhook_endpoints (id),
    due_at      INTEGER NOT NULL,
    lease_until INTEGER,
    leased_by   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0 CONSTRAINT outbox_attempts_non_negative CHECK (attempts >= 0),
    last_error  TEXT,
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    outcome     TEXT
                CONSTRAINT outbox_outcome_known
                CHECK (outcome IN ('delivered', 'exhausted', 'endpoint-disabled', 'endpoint-deleted')),
    CONSTRAINT outbox_payout_iff_kind CHECK ((kind = 'payout') = (payout_id IS NOT NULL)),
    CONSTRAINT outbox_webhook_iff_kind
        CHECK ((kind = 'webhook') = (event_id IS NOT NULL AND endpoint_id IS NOT NULL)),
    CONSTRAINT outbox_outcome_only_for_webhooks_once_done
        CHECK (outcome IS NULL OR (kind = 'webhook' AND done_at IS NOT NULL)),
    CONSTRAINT outbox_one_delivery_per_endpoint UNIQUE (event_id, endpoint_id)
);

INSERT INTO outbox_with_webhooks (id, kind, payout_id, due_at, lease_until, leased_by, attempts,
                                  last_error, created_at, done_at)
SELECT id, kind, payout_id, due_at, lease_until, leased_by, attempts, last_error, created_at,
       done_at
FROM outbox;

DROP TABLE outbox;
ALTER TABLE outbox_with_webhooks RENAME TO outbox;

CREATE INDEX outbox_due ON outbox (kind, due_at, id) WHERE done_at IS NULL;
CREATE INDEX outbox_by_endpoint ON outbox (endpoint_id, id) WHERE endpoint_id IS NOT NULL;

CREATE TABLE ledger_marks (
    name TEXT PRIMARY KEY NOT NULL,
    at   INTEGER NOT NULL
);
INSERT INTO ledger_marks (name, at)
VALUES ('events', CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER));

CREATE TABLE webhook_attempts (
    job_id          INTEGER NOT NULL REFERENCES outbox (id),
    attempt         INTEGER NOT NULL,
    recorded_at     INTEGER NOT NULL,
    duration_ms     INTEGER NOT NULL,
    response_status INTEGER,
    error           TEXT,
    response_body   TEXT,
    PRIMARY KEY (job_id, attempt)
);
