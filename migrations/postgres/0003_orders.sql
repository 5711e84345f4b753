-- Orders: an amount an account owes once. An order is paid by exactly one ticket; the
-- database holds that itself — one payment entry per order (a unique order_id), and the
-- order's paying ticket and payment time set together, once.

CREATE TABLE orders (
    id             UUID PRIMARY KEY,
    account_id     UUID NOT NULL REFERENCES accounts (id),
    amount         BIGINT NOT NULL
                   CONSTRAINT orders_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    description    TEXT NOT NULL
                   CONSTRAINT orders_description_length CHECK (char_length(description) <= 200),
    -- The highest fencing token of the order's lock (`order:<id>`) a payment attempt
    -- carried, paid or refused. Only grows.
    fencing_token  BIGINT NOT NULL DEFAULT 0
                   CONSTRAINT orders_fencing_token_non_negative CHECK (fencing_token >= 0),
    paid_by_ticket UUID CONSTRAINT orders_paid_by_ticket_key UNIQUE REFERENCES tickets (id),
    paid_at        TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL,
    CONSTRAINT orders_paid_all_or_nothing CHECK ((paid_by_ticket IS NULL) = (paid_at IS NULL))
);

-- The account's orders, newest first.
CREATE INDEX orders_by_account ON orders (account_id, created_at);

ALTER TABLE entries
    ADD COLUMN order_id UUID REFERENCES orders (id),
    ADD CONSTRAINT entries_one_payment_per_order UNIQUE (order_id),
    DROP CONSTRAINT entries_kind_known,
    ADD CONSTRAINT entries_kind_known
        CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment')),
    ADD CONSTRAINT entries_order_iff_payment CHECK ((kind = 'order_payment') = (order_id IS NOT NULL));

CREATE FUNCTION orders_fencing_token_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the fencing token of order % only grows: % is below %',
        OLD.id, NEW.fencing_token, OLD.fencing_token
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER orders_fencing_token_only_grows
    BEFORE UPDATE ON orders
    FOR EACH ROW
    WHEN (NEW.fencing_token < OLD.fencing_token)
    EXECUTE FUNCTION orders_fencing_token_only_grows();

CREATE FUNCTION orders_paid_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'order % was paid by ticket %; it cannot be paid again or unpaid',
        OLD.id, OLD.paid_by_ticket
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER orders_paid_once
    BEFORE UPDATE ON orders
    FOR EACH ROW
    WHEN (OLD.paid_by_ticket IS NOT NULL
          AND NEW.paid_by_ticket IS DISTINCT FROM OLD.paid_by_ticket)
    EXECUTE FUNCTION orders_paid_once();
