#!/usr/bin/env bash
# Fuzzes payonce's HTTP API with Schemathesis, every check enabled, against the OpenAPI
# document the server itself serves: once in the embedded mode (a fresh SQLite file) and
# once in the distributed mode (a fresh PostgreSQL database and a fresh Redis namespace,
# both dropped afterwards). Fails if Schemathesis reports any failure in any mode.
#
#   scripts/fuzz.sh                                  # both modes, 50 examples per operation
#   MODES=embedded MAX_EXAMPLES=200 SEED=1 scripts/fuzz.sh
#
# Everything runs on loopback. Reports (JUnit, NDJSON, HAR) and server logs land in
# target/fuzz/<mode>/; `target/fuzz-venv/bin/st replay <id>` replays a reported failure.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/serve.sh

SCHEMATHESIS_VERSION=4.32.5
MODES=${MODES:-"embedded distributed"}
MAX_EXAMPLES=${MAX_EXAMPLES:-50} # per operation and phase
TIME_LIMIT=${TIME_LIMIT:-600}    # seconds per mode: a hard wall-clock cap (see below)
SEED=${SEED:-}                   # empty: a random seed, printed in the summary
OUT=$PWD/target/fuzz
VENV=$PWD/target/fuzz-venv

# --- Tools ------------------------------------------------------------------------
# A pinned Schemathesis in a private venv: its checks and generators change between
# releases, so an unpinned one would make the verdict drift on its own.
scripts/venv.sh "$VENV" "schemathesis==$SCHEMATHESIS_VERSION"
case " $MODES " in *" distributed "*) scripts/services.sh ;; esac
cargo build -p api --bin payonce --locked
mkdir -p "$OUT"

# --- Schemathesis configuration ----------------------------------------------------
# Secrets and ids come from the environment (`${VAR}` is expanded by Schemathesis), so
# the key never shows up in a process list.
cat >"$OUT/schemathesis.toml" <<EOF
# Written by scripts/fuzz.sh; edit it there.
# Warnings that mean the run itself is misconfigured (auth not applied, a pattern it
# cannot generate from, a filter that matches nothing) fail it like a failure would.
warnings.fail-on = ["missing_auth", "unused_openapi_auth", "unsupported_regex", "unmatched_filter"]
hooks = "$OUT/hooks.py"

# The document's bearer scheme (components.securitySchemes.api_key): Schemathesis sends
# the key only where the document asks for it, and ignored_auth probes without it.
[auth.openapi.api_key]
bearer = "\${PAYONCE_API_KEY}"

# Every {id} is the account this run opened: any other id is another account's (403) or
# nobody's (404), and nothing past authentication would ever be reached.
[parameters]
"path.id" = "\${PAYONCE_ACCOUNT_ID}"
# Likewise every {order_id} is the order this run placed for that account, and every
# {hold_id} the hold it placed (seven days: it stays held through the run unless the
# fuzzer captures or voids it, which it may).
"path.order_id" = "\${PAYONCE_ORDER_ID}"
"path.hold_id" = "\${PAYONCE_HOLD_ID}"

# Mask the Authorization header and the api_key field, but show Idempotency-Key: the
# default markers hide every header with "key" in its name.
[output.sanitization]
sensitive-markers = ["token", "secret", "password", "auth", "session", "passwd", "credential"]
EOF

# A refusal that depends on the account's state or on a key's history — 402 insufficient
# funds or points, 422 balance-limit, 422 idempotency-key-reuse for a second request with
# a used ticket (or a create's key sent again with another body), 409 order-already-paid
# for a second ticket paying an order — is part of the contract and no schema can declare
# it away, so positive_data_acceptance (ST202) must not count it. Nor a 400
# idempotency-key-invalid for a key that does not match the document's pattern:
# Schemathesis' coverage phase sends values such as `0` in an optional header that has a
# pattern as if they were valid. The hook checks such a key against the pattern the
# document itself states (passed in IDEMPOTENCY_KEY_PATTERN), so a key that matches it
# and is refused still fails the run. Only those: a 422 invalid-request for a
# schema-valid body still fails the run. Schemathesis prints how many failures this hook
# dropped. Likewise a webhook URL the SSRF guard refuses (422 webhook-url-refused): whether
# a URL is taken depends on what its host resolves to and on the operator's settings (the
# fuzzer's instances take loopback only), and the seventeenth endpoint of an account (422
# webhook-endpoint-limit) on how many it has. The webhook POSTs' keys (an endpoint's
# creation, a rotation, a retry by hand) are like the creates': a key sent again for
# another request is 422 idempotency-key-reuse.
cat >"$OUT/hooks.py" <<'EOF'
# Written by scripts/fuzz.sh; edit it there.
import os
import re

import schemathesis

SPENDS = ("/withdrawals", "/deposits", "/lottery-draws", "/payments", "/payouts")
CREATES = ("/v1/accounts", "/v1/accounts/{id}/orders")
STATE_REFUSALS = {
    402: {"/problems/insufficient-funds", "/problems/insufficient-points"},
    409: {"/problems/order-already-paid"},
    422: {"/problems/balance-limit", "/problems/idempotency-key-reuse"},
}
CREATE_REFUSALS = {422: {"/problems/idempotency-key-reuse"}}
ENDPOINTS = "/v1/accounts/{id}/webhook-endpoints"
ENDPOINT_REFUSALS = {
    422: {
        "/problems/webhook-url-refused",
        "/problems/webhook-endpoint-limit",
        "/problems/idempotency-key-reuse",
    }
}
WEBHOOK_POSTS = ("/rotate-secret", "/retry")
KEY_PATTERN = re.compile(os.environ["IDEMPOTENCY_KEY_PATTERN"])


def sent_key(case):
    for name, value in (case.headers or {}).items():
        if name.lower() == "idempotency-key":
            return value
    return None


@schemathesis.hook
def filter_failure(context, failure, case, response):
    if failure.code != "ST202" or case.method != "POST":
        return True
    try:
        problem_type = response.json().get("type")
    except Exception:
        return True
    if response.status_code == 400 and problem_type == "/problems/idempotency-key-invalid":
        key = sent_key(case)
        return key is None or KEY_PATTERN.search(key) is not None
    if case.path.endswith(SPENDS):
        return problem_type not in STATE_REFUSALS.get(response.status_code, set())
    if case.path in CREATES:
        return problem_type not in CREATE_REFUSALS.get(response.status_code, set())
    if case.path == ENDPOINTS:
        return problem_type not in ENDPOINT_REFUSALS.get(response.status_code, set())
    if case.path.endswith(WEBHOOK_POSTS):
        return problem_type not in CREATE_REFUSALS.get(response.status_code, set())
    return True
EOF

# --- One mode -----------------------------------------------------------------------
server=""
database=""
namespace=""
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
  fi
  if [ -n "$database" ]; then
    dropdb -h 127.0.0.1 -U postgres --if-exists --force "$database" || true
    database=""
  fi
  if [ -n "$namespace" ]; then
    redis-cli -h 127.0.0.1 -p 6379 --scan --pattern "$namespace:*" |
      xargs -r redis-cli -h 127.0.0.1 -p 6379 del >/dev/null || true
    namespace=""
  fi
}
trap cleanup EXIT

fuzz() {
  local mode=$1 dir=$OUT/$1 base account status=0
  rm -rf "$dir"
  mkdir -p "$dir"

  # A fresh store each time, so earlier runs cannot change what this one sees.
  local -a with_store=(env -u DATABASE_URL -u REDIS_URL)
  if [ "$mode" = distributed ]; then
    database="payonce_fuzz_$(date +%s)_$$"
    namespace="fuzz-$database"
    createdb -h 127.0.0.1 -U postgres "$database"
    # Payouts go to the bank services.sh keeps on 7700 (the embedded mode serves its own).
    with_store+=(DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database"
      REDIS_URL="redis://127.0.0.1:6379" PAYONCE_REDIS_NAMESPACE="$namespace"
      PAYONCE_BANK_URL="http://127.0.0.1:7700")
  else
    with_store+=(PAYONCE_DATA_DIR="$dir/data")
  fi

  # Webhook endpoints the fuzzer makes may be on loopback and nowhere else: nothing it makes
  # up is ever contacted outside this machine.
  with_store+=(PAYONCE_WEBHOOK_ALLOW_PRIVATE=true PAYONCE_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128)
  serve_payonce "$dir/payonce.log" "${with_store[@]:1}" PAYONCE_INSTANCE="fuzz-$mode" RUST_LOG=info,sqlx=warn

  # One account with room for many spends and draws (its key comes only in this answer).
  account=$(curl -fsS -X POST "$base/v1/accounts" -H 'content-type: application/json' \
    -d '{"name": "fuzz", "balance": 1000000, "points": 1000}')
  export PAYONCE_ACCOUNT_ID PAYONCE_API_KEY
  PAYONCE_ACCOUNT_ID=$(jq -r .id <<<"$account")
  PAYONCE_API_KEY=$(jq -r .api_key <<<"$account")
  export PAYONCE_ORDER_ID
  PAYONCE_ORDER_ID=$(curl -fsS -X POST "$base/v1/accounts/$PAYONCE_ACCOUNT_ID/orders" \
    -H "authorization: Bearer $PAYONCE_API_KEY" -H 'content-type: application/json' \
    -d '{"amount": 100, "description": "fuzz"}' | jq -r .order_id)
  export PAYONCE_HOLD_ID
  hold_ticket=$(curl -fsS -X POST "$base/v1/accounts/$PAYONCE_ACCOUNT_ID/tickets" \
    -H "authorization: Bearer $PAYONCE_API_KEY" | jq -r .ticket_id)
  PAYONCE_HOLD_ID=$(curl -fsS -X POST "$base/v1/accounts/$PAYONCE_ACCOUNT_ID/holds" \
    -H "authorization: Bearer $PAYONCE_API_KEY" -H "idempotency-key: $hold_ticket" \
    -H 'content-type: application/json' -d '{"amount": 100}' | jq -r .hold_id)

  # The key pattern the document states, for the hook (see above).
  export IDEMPOTENCY_KEY_PATTERN
  IDEMPOTENCY_KEY_PATTERN=$(curl -fsS "$base/openapi.json" |
    jq -r '[.. | objects | select(.name? == "Idempotency-Key") | .schema.pattern] | first')
  if [ -z "$IDEMPOTENCY_KEY_PATTERN" ] || [ "$IDEMPOTENCY_KEY_PATTERN" = null ]; then
    echo "the document states no pattern for Idempotency-Key" >&2
    exit 2
  fi
  echo "=== $mode: $base, account $PAYONCE_ACCOUNT_ID"
  # -n bounds the examples per operation and phase. --max-time is not used: in this
  # Schemathesis it is a budget that fuzzing and stateful testing repeat until spent, not
  # a cap; `timeout` is the cap. Run from $OUT so Schemathesis keeps its example database
  # and cache (.hypothesis/, .schemathesis/) there, not in the repository.
  (
    cd "$OUT"
    timeout -k 30 --signal=INT "$TIME_LIMIT" \
      "$VENV/bin/schemathesis" --config-file "$OUT/schemathesis.toml" run "$base/openapi.json" \
      --checks all --max-examples "$MAX_EXAMPLES" ${SEED:+--seed "$SEED"} \
      --report junit,ndjson,har --report-dir "$dir"
  ) || status=$?
  if [ "$status" = 124 ]; then
    echo "$mode: Schemathesis ran past TIME_LIMIT=${TIME_LIMIT}s" >&2
  fi

  # The ledger's own audit: whatever the fuzzer did, every invariant must still hold.
  "${with_store[@]}" target/debug/payonce audit || status=$?
  cleanup
  # Recorded, not returned: a function called as `fuzz || ...` would run without set -e.
  if [ "$status" != 0 ]; then failed+=("$mode"); fi
}

failed=()
for mode in $MODES; do
  case $mode in
    embedded | distributed) fuzz "$mode" ;;
    *) echo "unknown mode: $mode (embedded, distributed)" >&2; exit 2 ;;
  esac
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzzing failed in: ${failed[*]} (reports in $OUT/)" >&2
  exit 1
fi
echo "fuzzing passed in: $MODES"
