-- pgbench baseline for `cargo run --release -p ledger --example apply_bench`: the bare SQL of a
-- withdrawal — one conditional UPDATE and one INSERT per transaction — on tables shaped
-- like the ledger's (see bench/schema.sql). Variable: accounts (how many to spread over).
\set aid random(1, :accounts)
BEGIN;
UPDATE bench_accounts SET balance = balance - 1, fencing_token = fencing_token + 1
  WHERE id = :aid AND balance >= 1;
INSERT INTO bench_entries (account_id, ticket_id, kind, amount, points, balance_after, points_after, fencing_token, created_at)
  VALUES (:aid, gen_random_uuid(), 'withdrawal', -1, 0, 0, 0, 0, now());
END;
