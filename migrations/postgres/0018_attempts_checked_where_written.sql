-- A webhook attempt's reference to its delivery is made sure of where attempts are written,
-- not by a foreign key. The only statements that insert attempts take their deliveries from
-- the rows the same statement (or transaction) has just updated: the outbox row exists, and
-- is locked, when its attempt goes in. The foreign key's check ran again for each attempt a
-- lookup PostgreSQL makes through SPI, a fifth of what recording a batch of answers cost.
--
-- What the key also did, deleting a delivery's attempts with it (ON DELETE CASCADE), the
-- reaper now does in the statement that deletes finished deliveries; nothing else deletes
-- a webhook delivery.

ALTER TABLE webhook_attempts DROP CONSTRAINT webhook_attempts_job_id_fkey;
