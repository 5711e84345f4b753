#!/usr/bin/env bash
# Makes sure PostgreSQL and Redis run on 127.0.0.1 (5432, 6379), installing them from
# Debian's packages on a machine that lacks them. Idempotent: what already runs is left
# alone. Used by scripts/test.sh, scripts/demo.sh and .ci/run.
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=no
install() {
  if [ "$apt_updated" = no ]; then
    as_root apt-get update -qq
    apt_updated=yes
  fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# --- Tools the tests use ----------------------------------------------------------
# curl and jq run the README's walkthrough; headless Chromium and chromedriver drive the
# web page's browser test; redis-server also runs the tests' private Redis instances.
for tool in curl jq; do
  command -v "$tool" >/dev/null || install "$tool"
done
if ! command -v chromedriver >/dev/null || ! [ -x /usr/bin/chromium ]; then
  install chromium chromium-driver
fi
# promtool checks /metrics as Prometheus reads it. It comes with Debian's prometheus
# package, whose server is installed but not started (nothing here needs it running).
command -v promtool >/dev/null || install --no-install-recommends prometheus

# --- Redis -------------------------------------------------------------------
command -v redis-server >/dev/null || install redis-server
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
    sleep 0.1
  done
fi
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null

# --- PostgreSQL --------------------------------------------------------------
if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  install postgresql postgresql-contrib
fi
command -v pgbench >/dev/null || install postgresql-contrib
version=$(ls /etc/postgresql | sort -V | tail -n 1)
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 100); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 0.1
  done
fi
# A fresh Debian install asks for passwords on TCP; tests connect as postgres without
# one, so trust loopback connections (this is a test machine).
if ! psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1; then
  hba=/etc/postgresql/$version/main/pg_hba.conf
  as_root sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  sleep 1
fi
psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null
