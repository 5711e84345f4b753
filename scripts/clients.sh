#!/usr/bin/env bash
# The OpenAPI document generates working clients in other languages, without edits: a
# Python client (openapi-python-client, PyPI) and a TypeScript one (types by
# openapi-typescript, requests by openapi-fetch, npm) are generated from the document a
# fresh payonce serves (the embedded mode, on a free loopback port), and each runs the
# README's walkthrough against it — account, ticket, withdrawal, its replay, a reused
# ticket refused, the ticket's stored answer, a draw, an order paid once, a hold captured
# in part and refunded in part, an order refunded in part, another account's key refused (scripts/clients/walkthrough.{py,ts}). The TypeScript one is
# type-checked with `tsc --strict` first. Tool versions are pinned (the venv's pins, the
# npm lock file). Everything lands in target/clients/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/serve.sh

OPENAPI_PYTHON_CLIENT_VERSION=0.29.1
OUT=$PWD/target/clients
VENV=$PWD/target/clients-venv

scripts/venv.sh "$VENV" "openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION"
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
cargo build -p api --bin payonce --locked
rm -rf "$OUT"
mkdir -p "$OUT"

server=""
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}
trap cleanup EXIT

serve_payonce "$OUT/payonce.log" -u DATABASE_URL -u REDIS_URL -u PAYONCE_LOCK_URL \
  PAYONCE_DATA_DIR="$OUT/data" RUST_LOG=info
curl -fsS "$base/openapi.json" >"$OUT/openapi.json"

# --- Python -------------------------------------------------------------------------
"$VENV/bin/openapi-python-client" generate --path "$OUT/openapi.json" \
  --config scripts/clients/openapi-python-client.yml --output-path "$OUT/python" --overwrite
"$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall "$OUT/python"
"$VENV/bin/python" scripts/clients/walkthrough.py "$base"

# --- TypeScript ---------------------------------------------------------------------
mkdir -p "$OUT/typescript"
cp scripts/clients/package.json scripts/clients/package-lock.json scripts/clients/tsconfig.json \
  scripts/clients/walkthrough.ts "$OUT/typescript/"
(
  cd "$OUT/typescript"
  npm ci --silent --no-audit --no-fund
  npx --no-install openapi-typescript ../openapi.json --output schema.d.ts
  npx --no-install tsc --project .
  npx --no-install tsx walkthrough.ts "$base"
)
