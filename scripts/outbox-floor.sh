#!/usr/bin/env bash
# The floor under a webhook delivery's cost in PostgreSQL: the least outbox that records
# each delivery (ledger/bench/outbox_floor/), driven by pgbench without payonce — its
# claims and recordings in batches of 32, four clients — in alternating rounds of its two
# shapes, each round on fresh tables: payonce's (a claim that leases, then the answers
# recorded) and one write a job (rows locked across the sends). Prints, for each round,
# deliveries per second, the machine's time per delivery (its cores over the rate: an
# upper bound on PostgreSQL's, pgbench's share included) and PostgreSQL's CPU per delivery
# (every `postgres` process, from /proc: the autovacuum's too, so it jumps when a vacuum
# falls in the round). docs/benchmarks.md ("The outbox's floor") says what they mean.
#
#   scripts/outbox-floor.sh            # ROUNDS=3 SECS=6 JOBS=1000000
#
# Needs the services of scripts/services.sh. Talks to loopback only; its database is
# dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
secs=${SECS:-6}
jobs=${JOBS:-1000000}
dir=ledger/bench/outbox_floor
database=payonce_floor_$$
export PGHOST=127.0.0.1 PGUSER=postgres PGOPTIONS="-c client_min_messages=warning"
hz=$(getconf CLK_TCK)
cores=$(nproc)
postgres_ticks() {
  local total=0 stat rest
  for stat in /proc/[0-9]*/stat; do
    # `pid (comm) state …`: utime, stime, cutime, cstime are fields 14–17.
    rest=$(cat "$stat" 2>/dev/null) || continue
    [[ $rest == *" (postgres) "* ]] || continue
    total=$((total + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' <<<"$rest")))
  done
  echo "$total"
}
psql -qX -d postgres -c "create database $database"
trap 'psql -qX -d postgres -c "drop database if exists $database with (force)"' EXIT
for round in $(seq "$rounds"); do
  for shape in claim_then_record locked_send; do
    psql -qX -d "$database" -v jobs="$jobs" -f "$dir/schema.sql"
    before=$(postgres_ticks)
    done_count=$(pgbench -n -M prepared -c 4 -j 2 -T "$secs" -f "$dir/$shape.sql" "$database" 2>&1 |
      awk '/number of transactions actually processed/ { print $NF }')
    after=$(postgres_ticks)
    awk -v r="$round" -v s="$shape" -v n="$done_count" -v secs="$secs" -v t=$((after - before)) -v hz="$hz" -v c="$cores" \
      'BEGIN { d = n * 32; printf "round %d %-17s %6.0f deliveries/s   the machine %5.1f µs a delivery   PostgreSQL %5.1f µs\n", r, s, d / secs, 1e6 * c * secs / d, 1e6 * t / hz / d }'
  done
done
