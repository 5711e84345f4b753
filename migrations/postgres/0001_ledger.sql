-- The ledger: accounts, tickets (idempotency keys and their stored outcomes), and
-- append-only entries. Every invariant the database can hold itself is a constraint here;
-- the rest is checked by the ledger's audit.

CREATE TABLE accounts (
    id            UUID PRIMARY KEY,
    name          TEXT NOT NULL
                  CONSTRAINT accounts_name_length CHECK (char_length(name) BETWEEN 1 AND 100),
    balance       BIGINT NOT NULL
                  CONSTRAINT accounts_balance_non_negative CHECK (balance >= 0),
    points        BIGINT NOT NULL
                  CONSTRAINT accounts_points_non_negative CHECK (points >= 0),
    -- SHA-256 of the account's API key; the key itself is shown once and never stored.
    api_key_hash  BYTEA NOT NULL CONSTRAINT accounts_api_key_hash_key UNIQUE,
    -- The highest lock fencing token a write on this account carried. Only grows.
    fencing_token BIGINT NOT NULL DEFAULT 0
                  CONSTRAINT accounts_fencing_token_non_negative CHECK (fencing_token >= 0),
    created_at    TIMESTAMPTZ NOT NULL
);

CREATE TABLE tickets (
    id              UUID PRIMARY KEY,
    account_id      UUID NOT NULL REFERENCES accounts (id),
    created_at      TIMESTAMPTZ NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL,
    -- Set together, once, by the transaction that uses the ticket.
    operation       TEXT,
    fingerprint     TEXT,
    response_status INTEGER,
    -- JSON, not JSONB: the body is stored and replayed as written, never queried.
    response_body   JSON,
    completed_at    TIMESTAMPTZ,
    -- Set when the retention period dropped the stored body; the row stays as a tombstone
    -- so the ticket can never execute again.
    pruned_at       TIMESTAMPTZ,
    CONSTRAINT tickets_outcome_all_or_nothing CHECK (
        (completed_at IS NULL AND operation IS NULL AND fingerprint IS NULL
            AND response_status IS NULL AND response_body IS NULL AND pruned_at IS NULL)
        OR (completed_at IS NOT NULL AND operation IS NOT NULL AND fingerprint IS NOT NULL
            AND response_status IS NOT NULL AND (response_body IS NOT NULL OR pruned_at IS NOT NULL))
    )
) WITH (
    -- Room in each page for the one update a ticket gets when it is used, so that update
    -- is a heap-only tuple (HOT) update: no column it changes is indexed.
    fillfactor = 70
);

-- The reaper's scan: tickets past their expiry whose outcome is not yet pruned. Indexes no
-- column that using a ticket changes (see fillfactor above).
CREATE INDEX tickets_to_reap ON tickets (expires_at) WHERE pruned_at IS NULL;

CREATE TABLE entries (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    UUID NOT NULL REFERENCES accounts (id),
    -- NULL only for the opening entry; at most one entry per ticket.
    ticket_id     UUID CONSTRAINT entries_ticket_id_key UNIQUE,
    kind          TEXT NOT NULL
                  CONSTRAINT entries_kind_known CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw')),
    -- Signed changes to the account's balance and points.
    amount        BIGINT NOT NULL,
    points        BIGINT NOT NULL,
    balance_after BIGINT NOT NULL CONSTRAINT entries_balance_after_non_negative CHECK (balance_after >= 0),
    points_after  BIGINT NOT NULL CONSTRAINT entries_points_after_non_negative CHECK (points_after >= 0),
    fencing_token BIGINT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    CONSTRAINT entries_ticket_unless_opening CHECK ((kind = 'opening') = (ticket_id IS NULL))
);

CREATE INDEX entries_by_account ON entries (account_id, id);

CREATE FUNCTION entries_are_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'entries are append-only';
END
$$;

CREATE TRIGGER entries_are_append_only
    BEFORE UPDATE OR DELETE ON entries
    FOR EACH ROW EXECUTE FUNCTION entries_are_append_only();
