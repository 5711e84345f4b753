# Sourced by scripts that need a payonce of their own (scripts/fuzz.sh, scripts/clients.sh):
#
#   serve_payonce LOG [VAR=value...]
#
# starts target/debug/payonce on a free loopback port (port 0: the kernel picks one, and
# the server logs which) with the environment given, its output in LOG, and waits until
# it is ready. Sets `server` (its pid, for the caller's cleanup) and `base` (its URL); exits
# 2 if it never becomes ready.
serve_payonce() {
  local log=$1 address=""
  shift
  env "$@" PAYONCE_ADDR=127.0.0.1:0 NO_COLOR=1 target/debug/payonce >"$log" 2>&1 &
  server=$!
  for _ in $(seq 150); do
    address=$(sed 's/\x1b\[[0-9;]*m//g' "$log" |
      grep -o 'listening addr=127\.0\.0\.1:[0-9]*' | head -n 1 | cut -d= -f2 || true)
    [ -n "$address" ] && curl -fsS "http://$address/healthz" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.2
  done
  base="http://$address"
  if [ -z "$address" ] || ! curl -fsS "$base/readyz" >/dev/null; then
    echo "payonce did not become ready; see $log" >&2
    exit 2
  fi
}
