-- Finished work leaves the outbox, so that a claim walks open jobs only.
--
-- A payout's job is deleted in its settlement's transaction: the payout row holds all
-- that is kept of it (status, the bank's transfer id or reason, and now the claims it
-- took, which the payout's view showed from the job). A backlog of settled jobs no longer
-- lingers in the outbox's indexes until vacuum, and the job's "one per payout" key is
-- never needed again: a payout is settled once (its trigger says so).
ALTER TABLE payouts
    ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0
        CONSTRAINT payouts_attempts_non_negative CHECK (attempts >= 0);

-- The settled payouts' claims, from their jobs: the settle-once trigger stays off only for
-- this copy, inside the migration's transaction.
ALTER TABLE payouts DISABLE TRIGGER payouts_settle_once;
UPDATE payouts p SET attempts = o.attempts
FROM outbox o
WHERE o.payout_id = p.id AND p.status <> 'pending';
ALTER TABLE payouts ENABLE TRIGGER payouts_settle_once;

DELETE FROM outbox WHERE kind = 'payout' AND done_at IS NOT NULL;

-- A delivery stays listed (and can be sent again by hand) until the reaper deletes it,
-- PAYONCE_DELIVERY_RETENTION after it finished; its attempts go with it.
ALTER TABLE webhook_attempts
    DROP CONSTRAINT webhook_attempts_job_id_fkey,
    ADD CONSTRAINT webhook_attempts_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES outbox (id) ON DELETE CASCADE;

-- An outcome's event is its ticket: the stored outcome already says all the event says
-- (the account, the ticket, the status and body), so a spend writes no row of its own for
-- it — the event's id is the ticket's id, and its `data` and time are read from the ticket
-- when a delivery is claimed or listed. A delivery names its event by id and carries the
-- event's type; the id is either an `events` row's (a payout's settlement, which its
-- ticket's 202 does not describe, and every event written before this migration) or an
-- announcing ticket's. The ticket's stored outcome is kept while a delivery of it is
-- (the reaper prunes no outcome with a delivery left). `outcome_events` marks the change
-- for the audit: outcomes committed since announce without a row.
ALTER TABLE outbox
    ADD COLUMN event_type TEXT
        CONSTRAINT outbox_event_type_known
        CHECK (event_type IN ('withdrawal.succeeded', 'withdrawal.refused', 'lottery.drawn',
                              'order.paid', 'payout.succeeded', 'payout.failed'));
UPDATE outbox o SET event_type = e.type FROM events e WHERE e.id = o.event_id;
ALTER TABLE outbox
    DROP CONSTRAINT outbox_event_id_fkey,
    DROP CONSTRAINT outbox_webhook_iff_kind,
    ADD CONSTRAINT outbox_webhook_iff_kind
        CHECK ((kind = 'webhook')
               = (event_id IS NOT NULL AND endpoint_id IS NOT NULL AND event_type IS NOT NULL));

-- A delivery is open exactly while it has no outcome: the steps of a claimed delivery
-- tell it by `outcome IS NULL`, which the planner cannot answer through the index of open
-- work (see FINISH_DELIVERY in ledger/src/events.rs).
ALTER TABLE outbox
    ADD CONSTRAINT outbox_webhook_done_iff_outcome
        CHECK (kind <> 'webhook' OR (done_at IS NULL) = (outcome IS NULL));

INSERT INTO ledger_marks (name, at) VALUES ('outcome_events', clock_timestamp());
