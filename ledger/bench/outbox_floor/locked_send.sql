-- One write a job: 32 rows locked (no lease written), then ended with their attempts in
-- the same transaction — as a dispatcher that holds the lock across the sends would.
BEGIN;
SELECT array_agg(id)::text AS ids FROM (SELECT id FROM floor_outbox WHERE done_at IS NULL AND due_at <= clock_timestamp() ORDER BY due_at, id LIMIT 32 FOR UPDATE SKIP LOCKED) AS picked \gset
WITH ended AS (UPDATE floor_outbox AS o SET done_at = clock_timestamp(), attempts = o.attempts + 1 WHERE id = ANY (:ids::bigint[]) RETURNING id, attempts) INSERT INTO floor_attempts (job_id, attempt, status, created_at, duration_ms) SELECT id, attempts, 204, clock_timestamp(), 1 FROM ended;
COMMIT;
