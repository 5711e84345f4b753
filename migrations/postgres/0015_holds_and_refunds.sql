-- Holds and refunds (DESIGN.md, "Holds and refunds"): money set aside on an account, then
-- captured (all or part), voided or expired — once — and refunds of a paid order or of a
-- captured hold that never add up to more than was paid. The ledger settles each race
-- under the lock of what it changes; these constraints and triggers refuse the wrong
-- outcome on their own, whoever writes.

-- What the account's holds set aside: the amounts of its holds still in state 'held' —
-- those past their expiry included, until the sweeper records them. A spend is checked
-- against it in its own conditional update, and only where that refuses against the holds
-- not yet expired, counted in the same statement: available = balance − the holds held
-- and not expired, never negative.
ALTER TABLE accounts ADD COLUMN held BIGINT NOT NULL DEFAULT 0
    CONSTRAINT accounts_held_non_negative CHECK (held >= 0);

CREATE TABLE holds (
    id                 UUID PRIMARY KEY,
    account_id         UUID NOT NULL REFERENCES accounts (id),
    ticket_id          UUID NOT NULL CONSTRAINT holds_ticket_id_key UNIQUE REFERENCES tickets (id),
    amount             BIGINT NOT NULL
                       CONSTRAINT holds_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    state              TEXT NOT NULL DEFAULT 'held'
                       CONSTRAINT holds_state_known
                       CHECK (state IN ('held', 'captured', 'voided', 'expired')),
    captured_amount    BIGINT,
    refunded_amount    BIGINT NOT NULL DEFAULT 0,
    -- The highest fencing token of the hold's lock (`hold:<id>`) a capture, void or refund
    -- carried, done or refused. Only grows.
    fencing_token      BIGINT NOT NULL DEFAULT 0
                       CONSTRAINT holds_fencing_token_non_negative CHECK (fencing_token >= 0),
    expires_at         TIMESTAMPTZ NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL,
    resolved_at        TIMESTAMPTZ,
    resolved_by_ticket UUID CONSTRAINT holds_resolved_by_ticket_key UNIQUE REFERENCES tickets (id),
    CONSTRAINT holds_resolved_unless_held CHECK ((state = 'held') = (resolved_at IS NULL)),
    CONSTRAINT holds_resolved_by_a_request
        CHECK ((state IN ('captured', 'voided')) = (resolved_by_ticket IS NOT NULL)),
    CONSTRAINT holds_captured_within_the_hold
        CHECK ((state = 'captured') = (captured_amount IS NOT NULL)
               AND (captured_amount IS NULL OR captured_amount BETWEEN 1 AND amount)),
    CONSTRAINT holds_refunds_within_the_capture
        CHECK (refunded_amount >= 0 AND refunded_amount <= coalesce(captured_amount, 0)),
    -- Captured or voided before the expiry, expired at or after it: by the database's
    -- clock, which wrote `resolved_at`.
    CONSTRAINT holds_resolved_in_time
        CHECK (state = 'held' OR (state = 'expired') = (resolved_at >= expires_at))
);

-- The holds an account still sets aside, for the exact count of a spend the account's
-- `held` refused; and the sweeper's, in the order they expire.
CREATE INDEX holds_held ON holds (account_id) WHERE state = 'held';
CREATE INDEX holds_expiring ON holds (expires_at) WHERE state = 'held';

-- A hold is resolved once; after that only its refunds change it (the total refunded,
-- which only grows, and the token of the lock they ran under).
CREATE FUNCTION holds_resolve_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'hold % is % already', OLD.id, OLD.state
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER holds_resolve_once
    BEFORE UPDATE ON holds
    FOR EACH ROW
    WHEN (OLD.state <> 'held'
          AND ((NEW.state, NEW.captured_amount, NEW.resolved_at, NEW.resolved_by_ticket)
               IS DISTINCT FROM
               (OLD.state, OLD.captured_amount, OLD.resolved_at, OLD.resolved_by_ticket)
               OR NEW.refunded_amount < OLD.refunded_amount))
    EXECUTE FUNCTION holds_resolve_once();

CREATE FUNCTION holds_fencing_token_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the fencing token of hold % only grows: % is below %',
        OLD.id, NEW.fencing_token, OLD.fencing_token
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER holds_fencing_token_only_grows
    BEFORE UPDATE ON holds
    FOR EACH ROW
    WHEN (NEW.fencing_token < OLD.fencing_token)
    EXECUTE FUNCTION holds_fencing_token_only_grows();

-- A refund puts money back on the account, of one payment: a paid order or a captured
-- hold.
CREATE TABLE refunds (
    id         UUID PRIMARY KEY,
    account_id UUID NOT NULL REFERENCES accounts (id),
    ticket_id  UUID NOT NULL CONSTRAINT refunds_ticket_id_key UNIQUE REFERENCES tickets (id),
    order_id   UUID REFERENCES orders (id),
    hold_id    UUID REFERENCES holds (id),
    amount     BIGINT NOT NULL
               CONSTRAINT refunds_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    created_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT refunds_of_one_payment CHECK ((order_id IS NULL) <> (hold_id IS NULL))
);

CREATE INDEX refunds_of_order ON refunds (order_id, created_at) WHERE order_id IS NOT NULL;
CREATE INDEX refunds_of_hold ON refunds (hold_id, created_at) WHERE hold_id IS NOT NULL;

-- What an order's refunds added up to: never more than it paid, and nothing before it was
-- paid. Only grows.
ALTER TABLE orders ADD COLUMN refunded_amount BIGINT NOT NULL DEFAULT 0,
    ADD CONSTRAINT orders_refunds_within_the_payment
        CHECK (refunded_amount >= 0 AND refunded_amount <= amount
               AND (refunded_amount = 0 OR paid_by_ticket IS NOT NULL));

CREATE FUNCTION orders_refunded_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the refunds of order % only grow: % is below %',
        OLD.id, NEW.refunded_amount, OLD.refunded_amount
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER orders_refunded_only_grows
    BEFORE UPDATE ON orders
    FOR EACH ROW
    WHEN (NEW.refunded_amount < OLD.refunded_amount)
    EXECUTE FUNCTION orders_refunded_only_grows();

-- A capture's entry carries its hold (one per hold), a refund's its refund. Partial unique
-- indexes, not UNIQUE constraints: a constraint's index would take an entry for every
-- spend, NULL included (see 0004).
ALTER TABLE entries
    ADD COLUMN hold_id UUID REFERENCES holds (id),
    ADD COLUMN refund_id UUID REFERENCES refunds (id),
    DROP CONSTRAINT entries_kind_known,
    ADD CONSTRAINT entries_kind_known
        CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment',
                        'payout', 'payout_reversal', 'hold_capture', 'refund')),
    ADD CONSTRAINT entries_hold_iff_capture CHECK ((kind = 'hold_capture') = (hold_id IS NOT NULL)),
    ADD CONSTRAINT entries_refund_iff_refund CHECK ((kind = 'refund') = (refund_id IS NOT NULL));

CREATE UNIQUE INDEX entries_one_capture_per_hold ON entries (hold_id) WHERE hold_id IS NOT NULL;
CREATE UNIQUE INDEX entries_one_per_refund ON entries (refund_id) WHERE refund_id IS NOT NULL;
