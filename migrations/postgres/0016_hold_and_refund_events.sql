-- The events of holds and refunds (DESIGN.md, "Holds and refunds"; docs/webhooks.md):
-- `hold.captured`, `hold.voided` and `refund.succeeded` are their tickets' outcomes, as a
-- spend's are; `hold.expired` is a row of `events`, written by the sweep that records the
-- expiry and naming the ticket that placed the hold. The lists of known types grow by
-- these four. The new constraints are added NOT VALID, then validated: the validation
-- reads the table under a lock that lets writers go on, and every row it reads passed the
-- narrower list already.
ALTER TABLE events DROP CONSTRAINT events_type_known;
ALTER TABLE events
    ADD CONSTRAINT events_type_known
        CHECK (type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                        'order.paid', 'payout.succeeded', 'payout.failed', 'hold.captured',
                        'hold.voided', 'hold.expired', 'refund.succeeded')) NOT VALID;
ALTER TABLE events VALIDATE CONSTRAINT events_type_known;

ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_known;
ALTER TABLE outbox
    ADD CONSTRAINT outbox_event_type_known
        CHECK (event_type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                              'order.paid', 'payout.succeeded', 'payout.failed',
                              'hold.captured', 'hold.voided', 'hold.expired',
                              'refund.succeeded')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_event_type_known;
