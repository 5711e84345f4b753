#!/usr/bin/env bash
# The test command: starts (or installs) PostgreSQL and Redis, then runs every test of the
# workspace against them. Tests only ever talk to loopback addresses.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
command -v cargo >/dev/null || { echo "cargo is required: https://rustup.rs" >&2; exit 1; }
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
# Databases the ledger and API tests created in earlier runs (each test makes its own).
psql -h 127.0.0.1 -U postgres -d postgres -Atqc \
  "select datname from pg_database where datname like 'payonce\_test\_%'" |
  while read -r database; do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists \"$database\"" >/dev/null
  done
# The flood tests open a few thousand loopback connections in one process.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo test --workspace --locked "$@"
