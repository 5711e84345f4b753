-- A claim takes the due jobs in (due_at, id) order, LIMIT a batch. With the index on
-- due_at alone the planner read every open job and sorted them all for each claim (a
-- sequential scan and a sort of thousands of rows to take 32 when a backlog built up);
-- on (due_at, id) it walks the index in the claim's order and stops at the batch.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (due_at, id) WHERE done_at IS NULL;
