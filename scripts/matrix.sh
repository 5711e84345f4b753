#!/usr/bin/env bash
# The lock services × faults demonstration: every lock service, fenced and unfenced, and
# the classic recipes, under every fault, one table. Starts PostgreSQL (scripts/services.sh;
# the lock services themselves are private servers the matrix starts, restarts and cuts
# off on loopback ports), builds the release binaries, runs `payonce-matrix` on a scratch
# database (created and dropped here: the unsafe rows corrupt the accounts they touch, on
# purpose), and prints the table and where the JSON and the chart are.
#
#   scripts/matrix.sh                 # --quick: 1 s per cell, under five minutes
#   scripts/matrix.sh --seconds 4     # the full one
#   scripts/matrix.sh --services etcd,zookeeper --faults sigstop,partition
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh
cargo build --release --locked -p api --features api/demo,api/all-locks -p matrix -p bank
out=target/matrix
mkdir -p "$out"

database="payonce_matrix_$(date +%s)_$$"
psql -h 127.0.0.1 -U postgres -d postgres -qc "create database $database"
trap 'psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists $database with (force)" >/dev/null || true' EXIT

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--quick)
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" \
  target/release/payonce-matrix "${args[@]}" --json "$out/matrix.json" --chart "$out/matrix.svg"
