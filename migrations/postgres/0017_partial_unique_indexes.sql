-- Four rules on columns that most rows leave NULL, held by partial unique indexes instead
-- of UNIQUE constraints, as 0004 did for an order's payment: a constraint's index holds an
-- entry for every row, NULL included, so each row that the rule does not concern still paid
-- for an index insertion — and again for every update that is not heap-only.
--
-- - entries_one_kind_per_payout: every withdrawal, draw, order payment, capture and refund
--   inserted a NULL key; only a payout's debit and reversal carry one.
-- - holds_resolved_by_ticket_key: every hold placed inserted a NULL key; only a capture or
--   a void sets it.
-- - outbox_one_job_per_payout: every webhook delivery inserted a NULL key, and again when
--   its outcome was recorded (that update changes `done_at`, which the open-work index's
--   predicate reads, so it is never heap-only).
-- - outbox_one_delivery_per_endpoint: the same for every payout job, whose `event_id` and
--   `endpoint_id` are NULL.
--
-- Each index keeps its constraint's name, which a violation reports, so the error a
-- violation maps to is unchanged. Lookups by the column with `=` (the foreign keys' checks
-- when a payout or a ticket is deleted, the reaper's "is this outcome still being
-- delivered") imply it is not NULL, so they use the partial index as they used the full
-- one.

ALTER TABLE entries DROP CONSTRAINT entries_one_kind_per_payout;
CREATE UNIQUE INDEX entries_one_kind_per_payout ON entries (payout_id, kind)
    WHERE payout_id IS NOT NULL;

ALTER TABLE holds DROP CONSTRAINT holds_resolved_by_ticket_key;
CREATE UNIQUE INDEX holds_resolved_by_ticket_key ON holds (resolved_by_ticket)
    WHERE resolved_by_ticket IS NOT NULL;

ALTER TABLE outbox DROP CONSTRAINT outbox_one_job_per_payout;
CREATE UNIQUE INDEX outbox_one_job_per_payout ON outbox (payout_id)
    WHERE payout_id IS NOT NULL;

ALTER TABLE outbox DROP CONSTRAINT outbox_one_delivery_per_endpoint;
CREATE UNIQUE INDEX outbox_one_delivery_per_endpoint ON outbox (event_id, endpoint_id)
    WHERE event_id IS NOT NULL;
