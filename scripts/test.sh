#!/usr/bin/env bash
# The test command: starts (or installs) PostgreSQL, Redis, ZooKeeper and etcd, then runs
# every test of the workspace, with every cargo feature, against them. Tests only ever
# talk to loopback addresses.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
command -v cargo >/dev/null || { echo "cargo is required: https://rustup.rs" >&2; exit 1; }
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
# Databases the ledger and API tests created in earlier runs (each test makes its own).
# Best effort: one still in use (a test run elsewhere) is left for the next time.
psql -h 127.0.0.1 -U postgres -d postgres -Atqc \
  "select datname from pg_database where datname like 'payonce\_test\_%'" |
  while read -r database; do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists \"$database\"" >/dev/null 2>&1 || true
  done
# Locks earlier runs left under the tests' roots in the shared ZooKeeper and etcd (each
# test uses a root of its own below these).
/usr/share/zookeeper/bin/zkCli.sh -server 127.0.0.1:2181 deleteall /payonce-tests \
  >/dev/null 2>&1 || true
curl -fsS -X POST http://127.0.0.1:2379/v3/kv/deleterange \
  -d "{\"key\": \"$(printf /payonce-tests/ | base64)\", \"range_end\": \"$(printf /payonce-tests0 | base64)\"}" \
  >/dev/null 2>&1 || true
# The Standard Webhooks reference library for Python, which an API test verifies
# payonce's webhook signatures with (api/tests/webhook_reference.py).
scripts/venv.sh target/webhooks-venv "standardwebhooks==1.1.0"
# The flood tests open a few thousand loopback connections in one process.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo test --workspace --all-features --locked "$@"
