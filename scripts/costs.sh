#!/usr/bin/env bash
# What each lock service costs, measured in one run on this machine: uncontended
# acquire+release pairs/s, hot-key hand-offs/s beside the serial limit, requests per
# pair and per hand-off, acquire p50/p99, and HTTP withdrawals/s through payonce on each.
# Starts the services (scripts/services.sh), builds the benchmark in release, and writes
# target/costs/costs.json and target/costs/costs.svg.
#
#   scripts/costs.sh                      # 5 s per measurement, 3 rounds
#   scripts/costs.sh --seconds 2 --rounds 1
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
cargo run --release --locked -p api --features demo,all-locks --example lock_costs -- "$@"
