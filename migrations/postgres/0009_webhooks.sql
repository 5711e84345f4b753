-- Webhooks: every committed outcome is an event, written in the transaction of the outcome
-- it announces (never for one that rolled back), and queued in the same transaction for
-- each of its account's endpoints that subscribes to its type, as an outbox job of kind
-- 'webhook' — claimed, leased and fenced by its attempts like a payout's.

-- Where an account wants its events. The signing secret is sealed (ChaCha20-Poly1305,
-- under PAYONCE_WEBHOOK_KEY or the key in `sealing_keys`); during a rotation the previous
-- one signs too, until `previous_secret_until`.
CREATE TABLE webhook_endpoints (
    id                      UUID PRIMARY KEY,
    account_id              UUID NOT NULL REFERENCES accounts (id),
    url                     TEXT NOT NULL
                            CONSTRAINT webhook_endpoints_url_length CHECK (char_length(url) BETWEEN 1 AND 2048),
    -- The event types it subscribes to, space-separated; '*' for every type.
    event_types             TEXT NOT NULL,
    secret_sealed           BYTEA NOT NULL,
    previous_secret_sealed  BYTEA,
    previous_secret_until   TIMESTAMPTZ,
    disabled_at             TIMESTAMPTZ,
    disabled_reason         TEXT,
    deleted_at              TIMESTAMPTZ,
    created_at              TIMESTAMPTZ NOT NULL,
    CONSTRAINT webhook_endpoints_previous_with_until
        CHECK ((previous_secret_sealed IS NULL) = (previous_secret_until IS NULL)),
    CONSTRAINT webhook_endpoints_disabled_with_reason
        CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL))
);

CREATE INDEX webhook_endpoints_by_account ON webhook_endpoints (account_id, created_at, id);

-- What the spend's transaction reads to fan an event out: one row per live endpoint and
-- type it subscribes to ('*' for all). An endpoint disabled or deleted has none.
CREATE TABLE webhook_subscriptions (
    account_id  UUID NOT NULL,
    event_type  TEXT NOT NULL,
    endpoint_id UUID NOT NULL REFERENCES webhook_endpoints (id),
    PRIMARY KEY (account_id, event_type, endpoint_id)
);

-- The key that seals the endpoints' secrets when PAYONCE_WEBHOOK_KEY is not set: made by
-- the first instance that needs it, shared by every instance on this database.
CREATE TABLE sealing_keys (
    name       TEXT PRIMARY KEY,
    key        BYTEA NOT NULL CONSTRAINT sealing_keys_length CHECK (octet_length(key) = 32),
    created_at TIMESTAMPTZ NOT NULL
);

-- A committed outcome, announced. `data` is the event's JSON `data` object, as sent.
CREATE TABLE events (
    id         UUID PRIMARY KEY,
    account_id UUID NOT NULL REFERENCES accounts (id),
    type       TEXT NOT NULL
               CONSTRAINT events_type_known
               CHECK (type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                               'order.paid', 'payout.succeeded', 'payout.failed')),
    ticket_id  UUID NOT NULL,
    data       TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);

-- At most one event per ticket and type: a replay writes none, and a payout settles once.
-- (The one index besides the key: every spend writes an event, and each index costs it.)
CREATE UNIQUE INDEX events_once_per_ticket ON events (ticket_id, type);

-- A delivery is an outbox job: the event, the endpoint, and how it ended.
ALTER TABLE outbox
    ADD COLUMN event_id UUID REFERENCES events (id),
    ADD COLUMN endpoint_id UUID REFERENCES webhook_endpoints (id),
    ADD COLUMN outcome TEXT
        CONSTRAINT outbox_outcome_known
        CHECK (outcome IN ('delivered', 'exhausted', 'endpoint-disabled', 'endpoint-deleted')),
    DROP CONSTRAINT outbox_kind_known,
    ADD CONSTRAINT outbox_kind_known CHECK (kind IN ('payout', 'webhook')),
    ADD CONSTRAINT outbox_webhook_iff_kind
        CHECK ((kind = 'webhook') = (event_id IS NOT NULL AND endpoint_id IS NOT NULL)),
    ADD CONSTRAINT outbox_outcome_only_for_webhooks_once_done
        CHECK (outcome IS NULL OR (kind = 'webhook' AND done_at IS NOT NULL)),
    ADD CONSTRAINT outbox_one_delivery_per_endpoint UNIQUE (event_id, endpoint_id);

-- Each kind's workers claim their own jobs, in (due_at, id) order.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (kind, due_at, id) WHERE done_at IS NULL;
CREATE INDEX outbox_by_endpoint ON outbox (endpoint_id, id) WHERE endpoint_id IS NOT NULL;

-- When the ledger began to write events: outcomes committed before (a database older than
-- webhooks) have none, and the audit expects one only of those committed since.
CREATE TABLE ledger_marks (
    name TEXT PRIMARY KEY,
    at   TIMESTAMPTZ NOT NULL
);
INSERT INTO ledger_marks (name, at) VALUES ('events', clock_timestamp());

-- Every attempt to deliver, and what the endpoint answered.
CREATE TABLE webhook_attempts (
    job_id          BIGINT NOT NULL REFERENCES outbox (id),
    attempt         INTEGER NOT NULL,
    recorded_at     TIMESTAMPTZ NOT NULL,
    duration_ms     BIGINT NOT NULL,
    -- NULL when no answer came (a timeout, a refused connection).
    response_status INTEGER,
    -- What went wrong, or NULL for a 2xx.
    error           TEXT,
    -- The start of the answer's body, at most 1 KiB.
    response_body   TEXT,
    PRIMARY KEY (job_id, attempt)
);
