-- Payouts: money leaving payonce for an outside bank. A payout is written in the spend's
-- transaction — the debit entry, the payout row (pending) and its outbox job, with the
-- outcome under the ticket — and settled later by the dispatcher, in one transaction:
-- succeeded with the bank's transfer id, or failed with the bank's reason and a reversal
-- entry that credits the amount back.

CREATE TABLE payouts (
    id               UUID PRIMARY KEY,
    account_id       UUID NOT NULL REFERENCES accounts (id),
    ticket_id        UUID NOT NULL CONSTRAINT payouts_ticket_id_key UNIQUE REFERENCES tickets (id),
    amount           BIGINT NOT NULL
                     CONSTRAINT payouts_amount_range CHECK (amount BETWEEN 1 AND 1000000000000),
    -- The account at the bank.
    destination      TEXT NOT NULL
                     CONSTRAINT payouts_destination_length CHECK (char_length(destination) BETWEEN 1 AND 64),
    status           TEXT NOT NULL
                     CONSTRAINT payouts_status_known CHECK (status IN ('pending', 'succeeded', 'failed')),
    -- The bank's id of the transfer, once it said it made it.
    bank_transfer_id TEXT,
    -- The bank's reason, once it said it will never make it.
    failure_reason   TEXT,
    created_at       TIMESTAMPTZ NOT NULL,
    settled_at       TIMESTAMPTZ,
    CONSTRAINT payouts_succeeded_iff_transfer CHECK ((status = 'succeeded') = (bank_transfer_id IS NOT NULL)),
    CONSTRAINT payouts_failed_iff_reason CHECK ((status = 'failed') = (failure_reason IS NOT NULL)),
    CONSTRAINT payouts_settled_unless_pending CHECK ((status = 'pending') = (settled_at IS NULL))
);

CREATE INDEX payouts_by_account ON payouts (account_id, created_at, id);
CREATE INDEX payouts_pending ON payouts (created_at) WHERE status = 'pending';

-- A settled payout stays settled: the bank's word is final.
CREATE FUNCTION payouts_settle_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payout % is % already', OLD.id, OLD.status
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER payouts_settle_once
    BEFORE UPDATE ON payouts
    FOR EACH ROW
    WHEN (OLD.status <> 'pending')
    EXECUTE FUNCTION payouts_settle_once();

-- Work to do after a commit, written in the same transaction as what it announces: a
-- payout to send to the bank. Claimed by one worker at a time for a lease; `attempts`
-- counts the claims and fences them (a worker settles a job only at the count it claimed).
CREATE TABLE outbox (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT NOT NULL CONSTRAINT outbox_kind_known CHECK (kind IN ('payout')),
    payout_id   UUID CONSTRAINT outbox_one_job_per_payout UNIQUE REFERENCES payouts (id),
    due_at      TIMESTAMPTZ NOT NULL,
    lease_until TIMESTAMPTZ,
    leased_by   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0 CONSTRAINT outbox_attempts_non_negative CHECK (attempts >= 0),
    last_error  TEXT,
    created_at  TIMESTAMPTZ NOT NULL,
    done_at     TIMESTAMPTZ,
    CONSTRAINT outbox_payout_iff_kind CHECK ((kind = 'payout') = (payout_id IS NOT NULL))
);

CREATE INDEX outbox_due ON outbox (due_at) WHERE done_at IS NULL;

-- A payout's debit (with its ticket) and its reversal (without one: the bank's refusal
-- returns the money, not a request) carry the payout; one of each at most.
ALTER TABLE entries
    ADD COLUMN payout_id UUID REFERENCES payouts (id),
    ADD CONSTRAINT entries_one_kind_per_payout UNIQUE (payout_id, kind),
    DROP CONSTRAINT entries_kind_known,
    ADD CONSTRAINT entries_kind_known
        CHECK (kind IN ('opening', 'deposit', 'withdrawal', 'lottery_draw', 'order_payment',
                        'payout', 'payout_reversal')),
    ADD CONSTRAINT entries_payout_iff_payout_kind
        CHECK ((kind IN ('payout', 'payout_reversal')) = (payout_id IS NOT NULL)),
    DROP CONSTRAINT entries_ticket_unless_opening,
    ADD CONSTRAINT entries_ticket_unless_opening_or_reversal
        CHECK ((kind IN ('opening', 'payout_reversal')) = (ticket_id IS NULL));
