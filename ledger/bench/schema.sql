-- Tables for the pgbench baseline (bench/withdraw.sql): the ledger's accounts and entries,
-- keyed by integers so pgbench can pick rows, with only the columns the bare SQL touches.
-- Kept: the entries' primary key, UNIQUE ticket id, foreign key and (account_id, id) index,
-- and the accounts' balance and points checks. Left out (each in pgbench's favour; see
-- ../README.md): the other columns and checks, the api-key index, the fencing-token trigger,
-- the tickets table.
DROP TABLE IF EXISTS bench_entries;
DROP TABLE IF EXISTS bench_accounts;
CREATE TABLE bench_accounts (
    id            INTEGER PRIMARY KEY,
    balance       BIGINT NOT NULL CHECK (balance >= 0),
    points        BIGINT NOT NULL CHECK (points >= 0),
    fencing_token BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE bench_entries (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    INTEGER NOT NULL REFERENCES bench_accounts (id),
    ticket_id     UUID UNIQUE,
    kind          TEXT NOT NULL,
    amount        BIGINT NOT NULL,
    points        BIGINT NOT NULL,
    balance_after BIGINT NOT NULL,
    points_after  BIGINT NOT NULL,
    fencing_token BIGINT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX bench_entries_by_account ON bench_entries (account_id, id);
INSERT INTO bench_accounts (id, balance, points)
    SELECT i, 1000000000000, 0 FROM generate_series(1, :accounts) AS i;
