-- The bank's tables. Every key the bank has seen is one row of `transfers`: a transfer it
-- executed, one it declined, or a key closed without a transfer. The UNIQUE index on the
-- key is what makes a key execute at most once, and what makes a close and a create
-- under one key exclude each other.
CREATE TABLE bank_transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('executed', 'declined', 'closed')),
    destination TEXT,
    amount INTEGER CHECK (amount > 0),
    reference TEXT,
    -- sha256 of the request's canonical body: a repeat with another body is refused.
    fingerprint TEXT,
    decline_reason TEXT,
    -- The stored answer, replayed to a repeat of the request (none for a closed key).
    answer_status INTEGER,
    answer_body TEXT,
    -- Microseconds since the Unix epoch, by the bank's clock.
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX bank_transfers_key ON bank_transfers (idempotency_key);

-- Each destination's running total of executed transfers.
CREATE TABLE bank_destinations (
    destination TEXT PRIMARY KEY,
    total INTEGER NOT NULL,
    transfers INTEGER NOT NULL
);

-- The grand total, one row. (SQLite writes one transaction at a time, so ids are handed
-- out in commit order without a lock of the bank's own.)
CREATE TABLE bank_totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    total INTEGER NOT NULL,
    transfers INTEGER NOT NULL
);
INSERT INTO bank_totals (id, total, transfers) VALUES (1, 0, 0);
