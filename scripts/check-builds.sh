#!/usr/bin/env bash
# The builds other than the test build (which has every feature): the default build
# (Redis, PostgreSQL advisory and in-process locks), a build with no lock service but the
# in-process one, and the `lock` crate with each lock service on its own — each compiles
# cleanly. Then the default binary is asked for services it was built without, and must
# refuse to start naming the feature to build with — before it connects to anything (the
# database they are given is not there).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy -p api --lib --bins --locked -- -D warnings
cargo clippy -p api --lib --bins --locked --no-default-features -- -D warnings
for feature in redis redis-cluster redis-sentinel zookeeper etcd postgres mysql memcached hazelcast; do
  cargo clippy -p lock --lib --locked --no-default-features --features "$feature" -- -D warnings
done

# The default binary (the one scripts/fuzz.sh and scripts/clients.sh run too).
cargo build -p api --bin payonce --locked
refuses() {
  local expected=$1
  shift
  local output
  if output=$(env -u REDIS_URL -u PAYONCE_LOCK_URL -u DATABASE_URL \
      -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
      PAYONCE_ADDR=127.0.0.1:0 "$@" timeout 30 target/debug/payonce 2>&1); then
    echo "the default build started with $* instead of refusing" >&2
    exit 1
  fi
  if ! grep -qF -- "$expected" <<<"$output"; then
    echo "the default build refused $* without naming $expected:" >&2
    echo "$output" >&2
    exit 1
  fi
}
refuses "--features redis-cluster" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=redis-cluster://127.0.0.1:7000,127.0.0.1:7001
refuses "--features redis-sentinel" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=redis-sentinel://127.0.0.1:26379/payonce
refuses "--features zookeeper" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=zk://127.0.0.1:2181/payonce
refuses "--features etcd" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=etcd://127.0.0.1:2379/payonce
refuses "--features mysql" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=mysql-row://root@127.0.0.1:3306/payonce_locks
refuses "--features memcached" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=memcache://127.0.0.1:11211
refuses "--features hazelcast" DATABASE_URL=postgres://postgres@127.0.0.1:1/payonce PAYONCE_LOCK_URL=hazelcast://127.0.0.1:5701
refuses "--features otlp" OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
echo "default build: compiles, and refuses the lock services and exporter it was built without"
