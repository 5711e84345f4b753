-- A claim takes the due jobs in (due_at, id) order, LIMIT a batch: on (due_at, id) the
-- index gives that order, so a backlog is not sorted whole for every claim.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (due_at, id) WHERE done_at IS NULL;
