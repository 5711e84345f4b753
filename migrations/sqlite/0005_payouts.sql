-- The same as migrations/postgres/0007_payouts.sql, in SQLite's types and syntax. SQLite
-- cannot change a table's constraints in place, so `entries` is rebuilt with the new
-- column and kinds (its rows and ids kept).

CREATE TABLE payouts (
    id               BLOB PRIMARY KEY NOT NULL,
    account_id       BLOB NOT NULL REFERENCES accounts (id),
    ticket_id        BLOB NOT NULL CONSTRAINT payouts_ticket_id_key UNIQUE REFERENCES tickets (id),
    amount           INTEGER NOT NULL
                     CONSTRAINT payouts_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    destination      TEXT NOT NULL
                     CONSTRAINT payouts_destination_length CHECK (length(destination) BETWEEN 1 AND 64),
    status           TEXT NOT NULL
                     CONSTRAINT payouts_status_known CHECK (status IN ('pending', 'succeeded', 'failed')),
    bank_transfer_id TEXT,
    failure_reason   TEXT,
    created_at       INTEGER NOT NULL,
    settled_at       INTEGER,
    CONSTRAINT payouts_succeeded_iff_transfer CHECK ((status = 'succeeded') = (bank_transfer_id IS NOT NULL)),
    CONSTRAINT payouts_failed_iff_reason CHECK ((status = 'failed') = (failure_reason IS NOT NULL)),
    CONSTRAINT payouts_settled_unless_pending CHECK ((status = 'pending') = (settled_at IS NULL))
);

CREATE INDEX payouts_by_account ON payouts (account_id, created_at, id);
CREATE INDEX payouts_pending ON payouts (created_at) WHERE status = 'pending';

CREATE TRIGGER payouts_settle_once BEFORE UPDATE ON payouts
WHEN OLD.status <> 'pending'
BEGIN
    SELECT RAISE(ABORT, 'a payout is settled once');
END;

CREATE TABLE outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL CONSTRAINT outbox_kind_known CHECK (kind IN ('payout')),
    payout_id   BLOB CONSTRAINT outbox_one_job_per_payout UNIQUE REFERENCES payouts (id),
    due_at      INTEGER NOT NULL,
    lease_until INTEGER,
    leased_by   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0 CONSTRAINT outbox_attempts_non_negative CHECK (attempts >= 0),
    last_error  TEXT,
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    CONSTRAINT outbox_payout_iff_kind CHECK ((kind = 'payout') = (payout_id IS NOT NULL))
);

CREATE INDEX outbox_due ON outbox (due_at) WHERE done_at IS NULL;

DROP TRIGGER entries_no_update;
DROP TRIGGER entries_no_delete;

CREATE TABLE entries_with_payouts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    BLOB NOT NULL REFERENCES accounts (id),
    ticket_id     BLOB CONSTRAINT entries_ticket_id_key UNIQUE,
    kind          TEXT NOT NULL
                  CONSTRAINT entries_kind_known
                  CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment',
                                  'payout', 'payout_reversal')),
    amount        INTEGER NOT NULL,
    points        INTEGER NOT NULL,
    balance_after INTEGER NOT NULL CONSTRAINT entries_balance_after_non_negative CHECK (balance_after >= 0),
    points_after  INTEGER NOT NULL CONSTRAINT entries_points_after_non_negative CHECK (points_after >= 0),
    fencing_token INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    order_id      BLOB CONSTRAINT entries_one_payment_per_order UNIQUE REFERENCES orders (id),
    payout_id     BLOB REFERENCES payouts (id),
    CONSTRAINT entries_one_kind_per_payout UNIQUE (payout_id, kind),
    CONSTRAINT entries_ticket_unless_opening_or_reversal
        CHECK ((kind IN ('opening', 'payout_reversal')) = (ticket_id IS NULL)),
    CONSTRAINT entries_order_iff_payment CHECK ((kind = 'order_payment') = (order_id IS NOT NULL)),
    CONSTRAINT entries_payout_iff_payout_kind
        CHECK ((kind IN ('payout', 'payout_reversal')) = (payout_id IS NOT NULL))
);

INSERT INTO entries_with_payouts (id, account_id, ticket_id, kind, amount, points,
                                  balance_after, points_after, fencing_token, created_at,
                                  order_id)
SELECT id, account_id, ticket_id, kind, amount, points, balance_after, points_after,
       fencing_token, created_at, order_id
FROM entries;

DROP TABLE entries;
ALTER TABLE entries_with_payouts RENAME TO entries;

CREATE INDEX entries_by_account ON entries (account_id, id);

CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;

CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;
