-- An account's held holds by account and expiry, where 0015 indexed them by account alone.
-- Every look at an account's holds asks for those held and past (or not past) a moment: a
-- hold step's check that none has expired unrecorded, a spend's count of what is set
-- aside, the account as the API shows it. With the expiry in the key, the check is one
-- range of the index — empty, but for holds the sweeper has yet to record — however many
-- holds the account has outstanding; by account alone, each hold step of an account with
-- 20,000 held walked all of them (`stale_statistics.rs`: 3,700 blocks of this index for
-- 100 holds placed and captured, 204 now).
DROP INDEX holds_held;
CREATE INDEX holds_held ON holds (account_id, expires_at) WHERE state = 'held';
