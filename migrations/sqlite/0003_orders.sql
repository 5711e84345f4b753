-- The same as migrations/postgres/0003_orders.sql, in SQLite's types and syntax. SQLite
-- cannot change a table's constraints in place, so `entries` is rebuilt with the new
-- column and kinds (its rows and ids kept).

CREATE TABLE orders (
    id             BLOB PRIMARY KEY NOT NULL,
    account_id     BLOB NOT NULL REFERENCES accounts (id),
    amount         INTEGER NOT NULL
                   CONSTRAINT orders_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    description    TEXT NOT NULL
                   CONSTRAINT orders_description_length CHECK (length(description) <= 200),
    fencing_token  INTEGER NOT NULL DEFAULT 0
                   CONSTRAINT orders_fencing_token_non_negative CHECK (fencing_token >= 0),
    paid_by_ticket BLOB CONSTRAINT orders_paid_by_ticket_key UNIQUE REFERENCES tickets (id),
    paid_at        INTEGER,
    created_at     INTEGER NOT NULL,
    CONSTRAINT orders_paid_all_or_nothing CHECK ((paid_by_ticket IS NULL) = (paid_at IS NULL))
);

CREATE INDEX orders_by_account ON orders (account_id, created_at);

DROP TRIGGER entries_no_update;
DROP TRIGGER entries_no_delete;

CREATE TABLE entries_with_orders (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    BLOB NOT NULL REFERENCES accounts (id),
    ticket_id     BLOB CONSTRAINT entries_ticket_id_key UNIQUE,
    kind          TEXT NOT NULL
                  CONSTRAINT entries_kind_known
                  CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment')),
    amount        INTEGER NOT NULL,
    points        INTEGER NOT NULL,
    balance_after INTEGER NOT NULL CONSTRAINT entries_balance_after_non_negative CHECK (balance_after >= 0),
    points_after  INTEGER NOT NULL CONSTRAINT entries_points_after_non_negative CHECK (points_after >= 0),
    fencing_token INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    order_id      BLOB CONSTRAINT entries_one_payment_per_order UNIQUE REFERENCES orders (id),
    CONSTRAINT entries_ticket_unless_opening CHECK ((kind = 'opening') = (ticket_id IS NULL)),
    CONSTRAINT entries_order_iff_payment CHECK ((kind = 'order_payment') = (order_id IS NOT NULL))
);

INSERT INTO entries_with_orders (id, account_id, ticket_id, kind, amount, points,
                                 balance_after, points_after, fencing_token, created_at)
SELECT id, account_id, ticket_id, kind, amount, points, balance_after, points_after,
       fencing_token, created_at
FROM entries;

DROP TABLE entries;
ALTER TABLE entries_with_orders RENAME TO entries;

CREATE INDEX entries_by_account ON entries (account_id, id);

CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;

CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;

CREATE TRIGGER orders_fencing_token_only_grows BEFORE UPDATE ON orders
WHEN NEW.fencing_token < OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'the fencing token of an order only grows');
END;

CREATE TRIGGER orders_paid_once BEFORE UPDATE ON orders
WHEN OLD.paid_by_ticket IS NOT NULL AND NEW.paid_by_ticket IS NOT OLD.paid_by_ticket
BEGIN
    SELECT RAISE(ABORT, 'an order is paid once');
END;
