#!/usr/bin/env bash
# What an idle payonce instance costs: its own CPU, the database transactions and the Redis
# commands it causes, over SECS seconds (default 60) in which no request comes — for each
# binary given (default: target/release/payonce), one after the other, each on a fresh
# database with the default settings (PostgreSQL + Redis, webhooks on, no bank).
#
#   cargo build --release -p api && scripts/idle-cost.sh [BINARY ...]
#
# Needs the services of scripts/services.sh. Talks to loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECS:-60}
[ $# -gt 0 ] || set -- target/release/payonce
hz=$(getconf CLK_TCK)
sql() { psql -qAtX -h 127.0.0.1 -U postgres -d postgres -c "$1"; }
redis_commands() { redis-cli -h 127.0.0.1 -p 6379 info stats | awk -F: '/^total_commands_processed/ {print $2+0}'; }
for binary in "$@"; do
  database=payonce_idle_$$_$RANDOM
  sql "create database $database"
  PAYONCE_ADDR=127.0.0.1:0 PAYONCE_REDIS_NAMESPACE="$database" \
    DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" REDIS_URL=redis://127.0.0.1:6379 \
    "$binary" >/dev/null 2>&1 &
  pid=$!
  # Started, migrated and settled: what follows is idling.
  sleep 10
  kill -0 "$pid"
  transactions="select xact_commit + xact_rollback from pg_stat_database where datname = '$database'"
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  cpu0=$(ticks); tx0=$(sql "$transactions"); r0=$(redis_commands)
  sleep "$secs"
  cpu1=$(ticks); tx1=$(sql "$transactions"); r1=$(redis_commands)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  sql "drop database $database with (force)"
  # The INFO calls themselves count once each between the two readings.
  awk -v b="$binary" -v s="$secs" -v c=$((cpu1 - cpu0)) -v hz="$hz" -v t=$((tx1 - tx0)) -v r=$((r1 - r0 - 1)) \
    'BEGIN { printf "%s idle %ds: CPU %.2f%% of a core; %d database transactions (%.2f/s); %d Redis commands on the server (the whole server: others count too)\n", b, s, 100 * c / hz / s, t, t / s, r < 0 ? 0 : r }'
done
