#!/usr/bin/env bash
# Makes sure PostgreSQL, Redis, a Redis Cluster, ZooKeeper, etcd, MariaDB and memcached run
# on 127.0.0.1 (5432, 6379, 7000-7005, 2181, 2379, 3306, 11211), installing them from
# Debian's packages on a machine that lacks them, three Hazelcast members (5701-5703, the
# jar from Maven Central), and payonce-bank (built from this
# checkout) on 127.0.0.1:7700. Idempotent: what already runs is left alone. Used by
# scripts/test.sh, scripts/fuzz.sh and .ci/run.
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Runs the command after TRIES and PAUSE (its output discarded) up to TRIES times, PAUSE
# seconds apart, until it succeeds. Never fails itself: each caller checks its service
# afterwards and says what did not start.
wait_until() {
  local tries=$1 pause=$2
  shift 2
  for _ in $(seq "$tries"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep "$pause"
  done
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
  wait_until 50 0.1 redis-cli -h 127.0.0.1 -p 6379 ping
fi
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null

# --- Redis Cluster -----------------------------------------------------------
# Six nodes on 127.0.0.1:7000-7005 (three masters, three replicas; cluster bus on
# 17000-17005) for the lock's shared test suite on a cluster (PAYONCE_LOCK_URL=
# redis-cluster://…). Nothing on disk but each node's cluster configuration, under
# /var/lib/redis-cluster/<port>, so a node started again rejoins its cluster. Tests that
# kill a master start a private cluster of their own.
cluster_ports="7000 7001 7002 7003 7004 7005"
cluster_ok() {
  local port
  for port in $cluster_ports; do
    redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done
}
if ! cluster_ok; then
  for port in $cluster_ports; do
    if ! redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
      as_root mkdir -p "/var/lib/redis-cluster/$port"
      as_root redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
        --save "" --appendonly no --dir "/var/lib/redis-cluster/$port" \
        --logfile "/var/lib/redis-cluster/$port/redis.log"
    fi
  done
  for port in $cluster_ports; do
    wait_until 50 0.1 redis-cli -h 127.0.0.1 -p "$port" ping
  done
  # Fresh nodes (no slots anywhere yet) are joined into a cluster; nodes that restarted
  # with their configuration find each other again by themselves.
  if [ "$(redis-cli -h 127.0.0.1 -p 7000 cluster info | grep -c '^cluster_slots_assigned:0')" = 1 ]; then
    redis-cli --cluster create $(for port in $cluster_ports; do printf '127.0.0.1:%s ' "$port"; done) \
      --cluster-replicas 1 --cluster-yes >/dev/null
  fi
  wait_until 200 0.1 cluster_ok
fi
cluster_ok || { echo "the Redis Cluster on 127.0.0.1:7000-7005 is not ok" >&2; exit 1; }

# --- PostgreSQL --------------------------------------------------------------
if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  install postgresql postgresql-contrib
fi
command -v pgbench >/dev/null || install postgresql-contrib
# The HTTP benchmarks' load generator (api/examples/http_bench.rs, lock_costs.rs).
command -v wrk >/dev/null || install wrk
version=$(ls /etc/postgresql | sort -V | tail -n 1)
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
  wait_until 100 0.1 pg_isready -q -h 127.0.0.1 -p 5432
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

# --- ZooKeeper ---------------------------------------------------------------
# Debian's zookeeper package (3.8, with a Java runtime), run with a configuration of our
# own: loopback only, no admin server (it would take port 8080, payonce's default), short
# ticks so sessions may be as short as 1 s, and the four-letter words readiness needs.
zk_ok() {
  local answer
  answer=$(timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/2181 && printf ruok >&3 && cat <&3' 2>/dev/null || true)
  [ "$answer" = imok ]
}
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || install zookeeper
if ! zk_ok; then
  zk_home=/var/lib/payonce/zookeeper
  as_root mkdir -p "$zk_home/data" /var/log/payonce
  printf '%s\n' \
    "tickTime=500" \
    "dataDir=$zk_home/data" \
    "clientPort=2181" \
    "clientPortAddress=127.0.0.1" \
    "admin.enableServer=false" \
    "minSessionTimeout=1000" \
    "maxSessionTimeout=60000" \
    "4lw.commands.whitelist=ruok,srvr,mntr" | as_root tee "$zk_home/zoo.cfg" >/dev/null
  as_root env ZOO_LOG_DIR=/var/log/payonce \
    /usr/share/zookeeper/bin/zkServer.sh start "$zk_home/zoo.cfg" >/dev/null 2>&1
  wait_until 150 0.2 zk_ok
fi
zk_ok || { echo "ZooKeeper did not start on 127.0.0.1:2181 (see /var/log/payonce)" >&2; exit 1; }

# --- etcd --------------------------------------------------------------------
# Debian's etcd-server (3.4): one member, on loopback. Its v2 API is on as well: the ledger
# cluster's Patroni keeps its state through it (scripts/ledger-cluster.sh says why); the
# lock's etcd backend speaks v3.
etcd_ok() {
  curl -fsS --max-time 2 http://127.0.0.1:2379/health 2>/dev/null | grep -q '"health":"true"' &&
    curl -fsS --max-time 2 http://127.0.0.1:2379/v2/keys/ >/dev/null 2>&1
}
command -v etcd >/dev/null || install etcd-server
if ! etcd_ok; then
  # One started earlier without the v2 API is started again with it (its data stays).
  as_root start-stop-daemon --stop --oknodo --retry 10 --exec /usr/bin/etcd >/dev/null
  as_root mkdir -p /var/lib/payonce/etcd /var/log/payonce
  as_root start-stop-daemon --start --oknodo --background --make-pidfile \
    --pidfile /var/lib/payonce/etcd.pid --output /var/log/payonce/etcd.log \
    --exec /usr/bin/etcd -- \
    --name payonce --data-dir /var/lib/payonce/etcd \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster payonce=http://127.0.0.1:2380 --enable-v2=true
  wait_until 100 0.2 etcd_ok
fi
etcd_ok || { echo "etcd did not start on 127.0.0.1:2379 (see /var/log/payonce/etcd.log)" >&2; exit 1; }

# --- MariaDB -----------------------------------------------------------------
# Debian's mariadb-server, on loopback; root may connect over TCP from 127.0.0.1 without a
# password (this is a test machine), as the lock tests do.
mariadb_ok() {
  mysql -h 127.0.0.1 -P 3306 -u root -e 'select 1' >/dev/null 2>&1
}
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || install mariadb-server
if ! mariadb_ok; then
  if ! mysqladmin ping >/dev/null 2>&1; then
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    if [ -x /etc/init.d/mariadb ]; then
      as_root /etc/init.d/mariadb start >/dev/null
    else
      as_root start-stop-daemon --start --oknodo --background --exec /usr/bin/mysqld_safe -- \
        --bind-address=127.0.0.1
    fi
    wait_until 100 0.2 as_root mysqladmin ping
  fi
  mariadb_ok || as_root mysql -u root -e \
    "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
     GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
  # The server resolves 127.0.0.1 to 'localhost' and may match a TCP client to
  # root@localhost, which Debian makes socket-only: let that entry take an empty password
  # over TCP too (the socket still works as before). The password plugin first: a client
  # offered the socket plugin first is asked to switch, and sqlx's MySQL driver answers
  # the switch with a scramble the server refuses for an empty password.
  mariadb_ok || as_root mysql -u root -e \
    "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;"
fi
mariadb_ok || { echo "MariaDB does not answer on 127.0.0.1:3306 as root" >&2; exit 1; }
# The database the lock tests and the examples name (the backends would make it on first
# use; the tests' own connections, which look from outside, need it there first).
mysql -h 127.0.0.1 -P 3306 -u root -e 'create database if not exists payonce_locks'

# --- memcached ---------------------------------------------------------------
memcached_ok() {
  [ "$(timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/11211 && printf "version\r\n" >&3 && head -c 7 <&3' 2>/dev/null || true)" = VERSION ]
}
command -v memcached >/dev/null || install memcached
if ! memcached_ok; then
  as_root memcached -d -l 127.0.0.1 -p 11211 -U 0 -m 64 -u memcache
  wait_until 50 0.1 memcached_ok
fi
memcached_ok || { echo "memcached did not start on 127.0.0.1:11211" >&2; exit 1; }

# --- Hazelcast ---------------------------------------------------------------
# Three members of Hazelcast 5.4.0 on 127.0.0.1:5701-5703 with the CP Subsystem (cluster
# name dev, Hazelcast's default): PAYONCE_LOCK_URL=hazelcast://…. 5.4.0 is the last
# Community Edition with the CP Subsystem (5.5 made it Enterprise only). The jar comes
# from Maven Central once, through Maven's cache, to /var/lib/payonce/hazelcast; each
# member runs deploy/hazelcast/member.yaml. Community Edition keeps CP state in memory
# only and a member that restarts never rejoins as the CP member it was, so unless all
# three answer with three CP members, all three are started afresh. The CP group `default`
# (payonce's unless its URL names another) is created and has elected a leader before the
# script ends: deploy/hazelcast/CpGroupReady.java takes a lock in it through Hazelcast's
# own Java client, run from source (so a JDK, not only a JRE).
hz_home=/var/lib/payonce/hazelcast
hz_jar=$hz_home/hazelcast-5.4.0.jar
hz_ports="5701 5702 5703"
hz_ok() {
  local members
  members=$(curl -fsS --max-time 2 http://127.0.0.1:5701/hazelcast/rest/cp-subsystem/members 2>/dev/null || true)
  [ "$(grep -o '"uuid"' <<<"$members" | wc -l)" -ge 3 ] || return 1
  for port in $hz_ports; do
    curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$port/hazelcast/health/ready" 2>/dev/null || return 1
  done
}
command -v javac >/dev/null || install --no-install-recommends openjdk-17-jdk-headless
command -v mvn >/dev/null || install --no-install-recommends maven
if [ ! -s "$hz_jar" ]; then
  mvn -q -B dependency:get -Dartifact=com.hazelcast:hazelcast:5.4.0 -Dtransitive=false
  as_root mkdir -p "$hz_home"
  as_root cp "$HOME/.m2/repository/com/hazelcast/hazelcast/5.4.0/hazelcast-5.4.0.jar" "$hz_jar"
fi
if ! hz_ok; then
  as_root mkdir -p "$hz_home" /var/log/payonce
  for port in $hz_ports; do
    as_root start-stop-daemon --stop --quiet --oknodo --retry 10 --pidfile "$hz_home/$port.pid" || true
  done
  members=$(printf '127.0.0.1:%s,' $hz_ports)
  for port in $hz_ports; do
    as_root start-stop-daemon --start --background --make-pidfile \
      --pidfile "$hz_home/$port.pid" --output "/var/log/payonce/hazelcast-$port.log" \
      --exec "$(readlink -f "$(command -v java)")" -- \
      -Xms128m -Xmx1g -XX:+UseSerialGC \
      --add-modules java.se --add-exports java.base/jdk.internal.ref=ALL-UNNAMED \
      --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
      --add-opens java.management/sun.management=ALL-UNNAMED \
      --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
      -Dhazelcast.config="$(cd "$(dirname "$0")/.." && pwd)/deploy/hazelcast/member.yaml" \
      -Dpayonce.cluster=dev -Dpayonce.port="$port" -Dpayonce.members="${members%,}" \
      -Dpayonce.session-ttl=10 \
      -cp "$hz_jar" com.hazelcast.core.server.HazelcastMemberStarter
  done
  wait_until 600 0.2 hz_ok
fi
hz_ok || { echo "Hazelcast's CP Subsystem did not form on 127.0.0.1:5701-5703 (see /var/log/payonce/hazelcast-*.log)" >&2; exit 1; }
if ! curl -fsS --max-time 2 http://127.0.0.1:5701/hazelcast/rest/cp-subsystem/groups 2>/dev/null | grep -q '"name":"default"'; then
  java -Xmx256m -cp "$hz_jar" "$(cd "$(dirname "$0")/.." && pwd)/deploy/hazelcast/CpGroupReady.java" \
    dev default $(printf '127.0.0.1:%s ' $hz_ports) ||
    { echo "Hazelcast's CP group default did not start (see /var/log/payonce/hazelcast-*.log)" >&2; exit 1; }
fi

# --- The bank ----------------------------------------------------------------
# payonce-bank (crate bank), the outside bank payouts go through, on 127.0.0.1:7700: built
# from this checkout as the tests build the workspace (so the build is shared with them,
# not a second one), the binary copied next to its SQLite store under
# /var/lib/payonce/bank (so a cargo clean does not pull it away), no fault rates, and the
# demonstration header on (tests aim a fault at one request with Payonce-Bank-Fault). A
# bank already running from another build of it is replaced (its store stays), so the
# tests meet the bank of the checkout they test.
bank_ok() {
  curl -fsS --max-time 2 http://127.0.0.1:7700/healthz 2>/dev/null | grep -q '"status":"ok"'
}
checkout=$(cd "$(dirname "$0")/.." && pwd)
(cd "$checkout" && cargo build --locked --quiet --workspace --all-features --bin payonce-bank)
bank_home=/var/lib/payonce/bank
bank_built="${CARGO_TARGET_DIR:-$checkout/target}/debug/payonce-bank"
if bank_ok && ! cmp -s "$bank_built" "$bank_home/payonce-bank"; then
  as_root start-stop-daemon --stop --oknodo --retry 5 --pidfile "$bank_home/payonce-bank.pid" >/dev/null
fi
if ! bank_ok; then
  as_root mkdir -p "$bank_home" /var/log/payonce
  # Copied aside and renamed into place: a binary still running (not answering) keeps its
  # old file. (Not `install`: that name is this script's apt-get step.)
  as_root cp "$bank_built" "$bank_home/payonce-bank.new"
  as_root mv -f "$bank_home/payonce-bank.new" "$bank_home/payonce-bank"
  as_root start-stop-daemon --start --oknodo --background --make-pidfile \
    --pidfile "$bank_home/payonce-bank.pid" --output /var/log/payonce/bank.log \
    --exec "$bank_home/payonce-bank" -- \
    --addr 127.0.0.1:7700 --database-url "sqlite:$bank_home/bank.db" --demo-header
  wait_until 100 0.1 bank_ok
fi
bank_ok || { echo "payonce-bank did not start on 127.0.0.1:7700 (see /var/log/payonce/bank.log)" >&2; exit 1; }
