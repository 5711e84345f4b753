#!/usr/bin/env bash
# Starts three payonce instances on PostgreSQL + Redis (started, or installed, by
# scripts/services.sh), runs the load test against them, and prints the verdict, the
# summary table, the ledger's own audit, and where the report and the chart are.
#
#   scripts/loadtest.sh                 # 20 s, 50 accounts, 32 clients, a webhook
#                                       # receiver that misbehaves on a share of them
#   DURATION=60s CLIENTS=64 scripts/loadtest.sh
#   PAYONCE_LOCK_URL=redis-cluster://127.0.0.1:7000,127.0.0.1:7001 scripts/loadtest.sh
#                                       # the locks on another service (here the Redis
#                                       # Cluster scripts/services.sh runs)
#
# Everything runs on loopback; a fresh database is created and dropped again (set
# KEEP_DATABASE=1 to keep it for inspection).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
CLIENTS=${CLIENTS:-32}
ACCOUNTS=${ACCOUNTS:-50}
PORTS=${PORTS:-"18181 18182 18183"}
OUT=target/loadtest

scripts/services.sh
# The default build has the Redis (one server) and PostgreSQL locks; another lock service
# needs its feature, so a run on one builds them all.
features=()
if [ -n "${PAYONCE_LOCK_URL:-}" ]; then
  features=(--features api/all-locks)
fi
cargo build --release --locked -p api -p loadtest "${features[@]}"
mkdir -p "$OUT"

database="payonce_loadtest_$(date +%s)_$$"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database"
if [ -n "${PAYONCE_LOCK_URL:-}" ]; then
  export PAYONCE_LOCK_URL
  unset REDIS_URL
else
  export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
fi
export PAYONCE_REDIS_NAMESPACE="$database"
# The instances pay out to the bank services.sh runs; the load test reconciles with it.
export PAYONCE_BANK_URL="${PAYONCE_BANK_URL:-http://127.0.0.1:7700}"
# Every account gets a webhook endpoint at the load test's receiver on loopback, which
# fails, throttles, dawdles on and ignores a share of the deliveries: a schedule of seconds
# (not the specification's hours) lets the run wait for every retry.
export PAYONCE_WEBHOOK_ALLOW_PRIVATE=true
export PAYONCE_WEBHOOK_RETRY_SCHEDULE="${PAYONCE_WEBHOOK_RETRY_SCHEDULE:-200ms,500ms,1s,2s,3s,5s,5s}"
export PAYONCE_WEBHOOK_TIMEOUT="${PAYONCE_WEBHOOK_TIMEOUT:-2s}"
export PAYONCE_WEBHOOK_LEASE="${PAYONCE_WEBHOOK_LEASE:-6s}"
psql -h 127.0.0.1 -U postgres -d postgres -qc "create database $database"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP_DATABASE:-0}" != 1 ]; then
    psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists $database with (force)" >/dev/null || true
  else
    echo "kept the database: $DATABASE_URL"
  fi
}
trap cleanup EXIT

targets=()
for port in $PORTS; do
  PAYONCE_ADDR="127.0.0.1:$port" PAYONCE_INSTANCE="payonce-$port" RUST_LOG=warn \
    target/release/payonce >"$OUT/payonce-$port.log" 2>&1 &
  pids+=($!)
  targets+=("http://127.0.0.1:$port")
done
for target in "${targets[@]}"; do
  for _ in $(seq 150); do
    curl -fsS "$target/readyz" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fsS "$target/readyz" >/dev/null || { echo "$target did not become ready; see $OUT/" >&2; exit 2; }
done

status=0
target/release/loadtest --targets "$(IFS=,; echo "${targets[*]}")" \
  --accounts "$ACCOUNTS" --clients "$CLIENTS" --duration "$DURATION" \
  --bank "$PAYONCE_BANK_URL" \
  --webhooks --receiver-fail 0.1 --receiver-throttle 0.03 --receiver-slow 0.03 --receiver-hang 0.01 \
  --report "$OUT/report.json" --chart "$OUT/chart.svg" || status=$?

echo
echo "the ledger's own audit (payonce audit):"
target/release/payonce audit || status=$?
exit "$status"
