-- The same as migrations/postgres/0015_holds_and_refunds.sql, in SQLite's types and syntax.
-- SQLite cannot change a table's constraints in place, so `entries` is rebuilt with the new
-- columns and kinds (its rows and ids kept).

ALTER TABLE accounts ADD COLUMN held INTEGER NOT NULL DEFAULT 0
    CONSTRAINT accounts_held_non_negative CHECK (held >= 0);

CREATE TABLE holds (
    id                 BLOB PRIMARY KEY NOT NULL,
    account_id         BLOB NOT NULL REFERENCES accounts (id),
    ticket_id          BLOB NOT NULL CONSTRAINT holds_ticket_id_key UNIQUE REFERENCES tickets (id),
    amount             INTEGER NOT NULL
                       CONSTRAINT holds_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    state              TEXT NOT NULL DEFAULT 'held'
                       CONSTRAINT holds_state_known
                       CHECK (state IN ('held', 'captured', 'voided', 'expired')),
    captured_amount    INTEGER,
    refunded_amount    INTEGER NOT NULL DEFAULT 0,
    fencing_token      INTEGER NOT NULL DEFAULT 0
                       CONSTRAINT holds_fencing_token_non_negative CHECK (fencing_token >= 0),
    expires_at         INTEGER NOT NULL,
    created_at         INTEGER NOT NULL,
    resolved_at        INTEGER,
    resolved_by_ticket BLOB CONSTRAINT holds_resolved_by_ticket_key UNIQUE REFERENCES tickets (id),
    CONSTRAINT holds_resolved_unless_held CHECK ((state = 'held') = (resolved_at IS NULL)),
    CONSTRAINT holds_resolved_by_a_request
        CHECK ((state IN ('captured', 'voided')) = (resolved_by_ticket IS NOT NULL)),
    CONSTRAINT holds_captured_within_the_hold
        CHECK ((state = 'captured') = (captured_amount IS NOT NULL)
               AND (captured_amount IS NULL OR captured_amount BETWEEN 1 AND amount)),
    CONSTRAINT holds_refunds_within_the_capture
        CHECK (refunded_amount >= 0 AND refunded_amount <= coalesce(captured_amount, 0)),
    CONSTRAINT holds_resolved_in_time
        CHECK (state = 'held' OR (state = 'expired') = (resolved_at >= expires_at))
);

CREATE INDEX holds_held ON holds (account_id) WHERE state = 'held';
CREATE INDEX holds_expiring ON holds (expires_at) WHERE state = 'held';

CREATE TRIGGER holds_resolve_once BEFORE UPDATE ON holds
WHEN OLD.state <> 'held'
     AND (NEW.state IS NOT OLD.state OR NEW.captured_amount IS NOT OLD.captured_amount
          OR NEW.resolved_at IS NOT OLD.resolved_at
          OR NEW.resolved_by_ticket IS NOT OLD.resolved_by_ticket
          OR NEW.refunded_amount < OLD.refunded_amount)
BEGIN
    SELECT RAISE(ABORT, 'a hold is resolved once');
END;

CREATE TRIGGER holds_fencing_token_only_grows BEFORE UPDATE ON holds
WHEN NEW.fencing_token < OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'the fencing token of a hold only grows');
END;

CREATE TABLE refunds (
    id         BLOB PRIMARY KEY NOT NULL,
    account_id BLOB NOT NULL REFERENCES accounts (id),
    ticket_id  BLOB NOT NULL CONSTRAINT refunds_ticket_id_key UNIQUE REFERENCES tickets (id),
    order_id   BLOB REFERENCES orders (id),
    hold_id    BLOB REFERENCES holds (id),
    amount     INTEGER NOT NULL
               CONSTRAINT refunds_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    created_at INTEGER NOT NULL,
    CONSTRAINT refunds_of_one_payment CHECK ((order_id IS NULL) <> (hold_id IS NULL))
);

CREATE INDEX refunds_of_order ON refunds (order_id, created_at) WHERE order_id IS NOT NULL;
CREATE INDEX refunds_of_hold ON refunds (hold_id, created_at) WHERE hold_id IS NOT NULL;

ALTER TABLE orders ADD COLUMN refunded_amount INTEGER NOT NULL DEFAULT 0
    CONSTRAINT orders_refunds_within_the_payment
    CHECK (refunded_amount >= 0 AND refunded_amount <= amount
           AND (refunded_amount = 0 OR paid_by_ticket IS NOT NULL));

CREATE TRIGGER orders_refunded_only_grows BEFORE UPDATE ON orders
WHEN NEW.refunded_amount < OLD.refunded_amount
BEGIN
    SELECT RAISE(ABORT, 'the refunds of an order only grow');
END;

DROP TRIGGER entries_no_update;
DROP TRIGGER entries_no_delete;

CREATE TABLE entries_with_holds (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    BLOB NOT NULL REFERENCES accounts (id),
    ticket_id     BLOB CONSTRAINT entries_ticket_id_key UNIQUE,
    kind          TEXT NOT NULL
                  CONSTRAINT entries_kind_known
                  CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment',
                                  'payout', 'payout_reversal', 'hold_capture', 'refund')),
    amount        INTEGER NOT NULL,
    points        INTEGER NOT NULL,
    balance_after INTEGER NOT NULL CONSTRAINT entries_balance_after_non_negative CHECK (balance_after >= 0),
    points_after  INTEGER NOT NULL CONSTRAINT entries_points_after_non_negative CHECK (points_after >= 0),
    fencing_token INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    order_id      BLOB CONSTRAINT entries_one_payment_per_order UNIQUE REFERENCES orders (id),
    payout_id     BLOB REFERENCES payouts (id),
    hold_id       BLOB CONSTRAINT entries_one_capture_per_hold UNIQUE REFERENCES holds (id),
    refund_id     BLOB CONSTRAINT entries_one_per_refund UNIQUE REFERENCES refunds (id),
    CONSTRAINT entries_one_kind_per_payout UNIQUE (payout_id, kind),
    CONSTRAINT entries_ticket_unless_opening_or_reversal
        CHECK ((kind IN ('opening', 'payout_reversal')) = (ticket_id IS NULL)),
    CONSTRAINT entries_order_iff_payment CHECK ((kind = 'order_payment') = (order_id IS NOT NULL)),
    CONSTRAINT entries_payout_iff_payout_kind
        CHECK ((kind IN ('payout', 'payout_reversal')) = (payout_id IS NOT NULL)),
    CONSTRAINT entries_hold_iff_capture CHECK ((kind = 'hold_capture') = (hold_id IS NOT NULL)),
    CONSTRAINT entries_refund_iff_refund CHECK ((kind = 'refund') = (refund_id IS NOT NULL))
);

INSERT INTO entries_with_holds (id, account_id, ticket_id, kind, amount, points, balance_after,
                                points_after, fencing_token, created_at, order_id, payout_id)
SELECT id, account_id, ticket_id, kind, amount, points, balance_after, points_after,
       fencing_token, created_at, order_id, payout_id
FROM entries;

DROP TABLE entries;
ALTER TABLE entries_with_holds RENAME TO entries;

CREATE INDEX entries_by_account ON entries (account_id, id);
CREATE INDEX entries_payout_debits ON entries (account_id, id) WHERE kind = 'payout';

CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;

CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
BEGIN
    SELECT RAISE(ABORT, 'entries are append-only');
END;
