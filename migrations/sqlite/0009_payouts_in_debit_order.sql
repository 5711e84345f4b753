-- The same as migrations/postgres/0011_payouts_in_debit_order.sql: an account's payouts
-- are listed in the order of their debit entries' ids. (SQLite's one writer commits its
-- transactions one after another, so the ids follow the commits here too.)
CREATE INDEX entries_payout_debits ON entries (account_id, id) WHERE kind = 'payout';
DROP INDEX payouts_by_account;
