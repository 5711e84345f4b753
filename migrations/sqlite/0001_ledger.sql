-- The ledger for the embedded mode: the same tables and constraints as
-- migrations/postgres/0001_ledger.sql, in SQLite's types. UUIDs are 16-byte BLOBs,
-- timestamps are INTEGER microseconds since the Unix epoch, JSON is TEXT.

CREATE TABLE accounts (
    id            BLOB PRIMARY KEY NOT NULL,
    name          TEXT NOT NULL
                  CONSTRAINT accounts_name_length CHECK (length(name) BETWEEN 1 AND 100),
    balance       INTEGER NOT NULL
                  CONSTRAINT accounts_balance_non_negative CHECK (balance >= 0),
    points        INTEGER NOT NULL
                  CONSTRAINT accounts_points_non_negative CHECK (points >= 0),
    api_key_hash  BLOB NOT NULL CONSTRAINT accounts_api_key_hash_key UNIQUE,
    fencing_token INTEGER NOT NULL DEFAULT 0
                  CONSTRAINT accounts_fencing_token_non_negative CHECK (fencing_token >= 0),
    created_at    INTEGER NOT NULL
);

CREATE TABLE tickets (
    id              BLOB PRIMARY KEY NOT NULL,
    account_id      BLOB NOT NULL REFERENCES accounts (id),
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    operation       TEXT,
    fingerprint     TEXT,
    response_status INTEGER,
    response_body   TEXT,
    completed_at    INTEGER,
    pruned_at       INTEGER,
    CONSTRAINT tickets_outcome_all_or_nothing CHECK (
        (completed_at IS NULL AND operation IS NULL AND fingerprint IS NULL
            AND response_status IS NULL AND response_body IS NULL AND pruned_at IS NULL)
        OR (completed_at IS NOT NULL AND operation IS NOT NULL AND fingerprint IS NOT NULL
            AND response_status IS NOT NULL AND (response_body IS NOT NULL OR pruned_at IS NOT NULL))
    )
);

CREATE INDEX tickets_to_reap ON tickets (expires_at) WHERE pruned_at IS NULL;

CREATE TABLE entries (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    BLOB NOT NULL REFERENCES accounts (id),
    ticket_id     BLOB CONSTRAINT entries_ticket_id_key UNIQUE,
    kind          TEXT NOT NULL
                  CONSTRAINT entries_kind_known CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw')),
    amount        INTEGER NOT NULL,
    points        INTEGER NOT NULL,
    balance_after INTEGER NOT NULL CONSTRAINT entries_balance_after_non_negative CHECK (balance_after >= 0),
    points_after  INTEGER NOT NULL CONSTRAINT entries_points_after_non_negative CHECK (points_after >= 0),
    fencing_token INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    CONSTRAINT entries_ticket_unless_opening CHECK ((kind = 'opening') = (ticket_id IS NULL))
);

CREATE INDEX entries_by_account ON entries (account_id, id);

CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;

CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;
