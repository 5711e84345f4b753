-- An account's payouts are listed (GET /v1/payouts) in the order of their debit entries'
-- ids, not of their `created_at`: a payout's transaction reads the clock before it locks
-- the account's row, so a payout can commit after another that read the clock later, and
-- a page that passed the later one's `created_at` would never show it. The debit entry is
-- written after the account's row is locked, and the row stays locked until the commit,
-- so of two payouts of one account the one that commits later has the greater entry id
-- (the identity has no cache: values are handed out in the order they are asked for).
-- The index walks an account's debits in that order; the one on (account_id, created_at,
-- id) served only the old order.
CREATE INDEX entries_payout_debits ON entries (account_id, id) WHERE kind = 'payout';
DROP INDEX payouts_by_account;
