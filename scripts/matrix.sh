#!/usr/bin/env bash
# The strategies × faults demonstration: every lock strategy under every fault, one table.
# Starts PostgreSQL and Redis (scripts/services.sh), builds the release binaries, runs
# `loadtest matrix` on a scratch database (created and dropped here: the unsafe strategies
# corrupt the accounts they touch, on purpose), and prints the table and where the JSON and
# the chart are.
#
#   scripts/matrix.sh            # --quick: 2 s per cell, under two minutes
#   scripts/matrix.sh --seconds 5
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh
cargo build --release --locked -p api --features demo -p loadtest
out=target/matrix
mkdir -p "$out"

database="payonce_matrix_$(date +%s)_$$"
psql -h 127.0.0.1 -U postgres -d postgres -qc "create database $database"
trap 'psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists $database with (force)" >/dev/null || true' EXIT

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--quick)
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" \
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}" \
  target/release/loadtest matrix "${args[@]}" --json "$out/matrix.json" --chart "$out/matrix.svg"
