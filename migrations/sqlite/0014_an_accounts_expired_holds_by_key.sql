-- As migrations/postgres/0019 says: an account's held holds are looked at by account and
-- expiry, so both are the index's key.
DROP INDEX holds_held;
CREATE INDEX holds_held ON holds (account_id, expires_at) WHERE state = 'held';
