#!/usr/bin/env bash
# The ledger cluster: three PostgreSQL nodes under Patroni (its state in the etcd that
# scripts/services.sh runs on 127.0.0.1:2379, through its v2 API), HAProxy in front on loopback routing to the
# primary by Patroni's REST health check. Each node lives in a network namespace of its
# own, so a fault is a cut link, not a proxy. docs/ledger-failover.md explains it.
#
#   scripts/ledger-cluster.sh up [--async]   start it, or switch its replication mode; the
#                                            last line is the write endpoint's DATABASE_URL
#   scripts/ledger-cluster.sh status         one JSON object: each member's name, role,
#                                            postmaster pid and Patroni pid
#   scripts/ledger-cluster.sh down           stop it; namespaces, data and etcd keys go too
#
# and the faults, for a person at a terminal (the tests and the matrix do the same with
# `ip` and `kill` themselves):
#
#   scripts/ledger-cluster.sh kill MEMBER    SIGKILL its Patroni and its postmaster
#   scripts/ledger-cluster.sh freeze MEMBER  SIGSTOP every process of its node
#   scripts/ledger-cluster.sh thaw MEMBER    SIGCONT them
#   scripts/ledger-cluster.sh cut MEMBER     take its link to the cluster network down
#   scripts/ledger-cluster.sh heal MEMBER    bring it back up
#
# The network, all of it inside namespaces this script makes (nothing outside them is
# ever addressed but loopback):
#   payonce-lhub  a bridge, 10.77.0.1/24: the cluster network. Node i is 10.77.0.1i on it.
#                 HAProxy listens here on 10.77.0.1:2379 and relays to etcd on loopback, so
#                 the nodes reach their DCS through the same link as each other.
#   payonce-lside one point-to-point link per node, 10.78.i.1 <-> 10.78.i.2, no forwarding:
#                 the "other side" of a partition. The side endpoint (127.0.0.1:5441)
#                 routes to whichever node says it is primary over these links, so a
#                 primary cut from the cluster network still takes writes there until
#                 Patroni demotes it: the split brain, for real.
#   payonce-l1..3 the nodes: PostgreSQL on 5432 and Patroni's REST API on 8008.
set -euo pipefail

readonly HUB=payonce-lhub SIDE=payonce-lside
readonly MEMBERS="pg1 pg2 pg3"
readonly WRITE_PORT=${PAYONCE_LEDGER_CLUSTER_PORT:-5440}
readonly SIDE_PORT=$((WRITE_PORT + 1))
readonly STATE=/var/lib/payonce/ledger-cluster
readonly LOGS=/var/log/payonce/ledger-cluster
readonly ETCD_PREFIX=/payonce-ledger/
readonly SCOPE=ledger
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)

# Patroni's timing. A primary that dies is noticed when its leader key expires (ttl), and
# a replica acts on its next loop (loop_wait): a failover takes about ttl + loop_wait. A
# primary that cannot reach etcd demotes itself after retry_timeout, and Patroni requires
# loop_wait + 2 * retry_timeout <= ttl so that it does so before anyone else may promote.
# Shorter means faster failover but a DCS hiccup of retry_timeout already demotes the
# primary (writes answer 503 until it is back). docs/ledger-failover.md has the figures.
readonly TTL=${PAYONCE_LEDGER_TTL:-10}
readonly LOOP_WAIT=${PAYONCE_LEDGER_LOOP_WAIT:-1}
readonly RETRY_TIMEOUT=${PAYONCE_LEDGER_RETRY_TIMEOUT:-4}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}
die() { echo "ledger-cluster: $*" >&2; exit 1; }
index_of() {
  case "$1" in pg1) echo 1 ;; pg2) echo 2 ;; pg3) echo 3 ;; *) die "no member named '$1' (pg1, pg2, pg3)" ;; esac
}
ns_of() { echo "payonce-l$(index_of "$1")"; }

install_missing() {
  local missing=()
  command -v patroni >/dev/null || missing+=(patroni)
  # Patroni's etcd client is python-etcd; Debian's patroni may pull in another DCS's
  # library in its place.
  /usr/bin/python3 -c 'import etcd' 2>/dev/null || missing+=(python3-etcd)
  command -v haproxy >/dev/null || missing+=(haproxy)
  command -v jq >/dev/null || missing+=(jq)
  command -v curl >/dev/null || missing+=(curl)
  command -v ip >/dev/null || missing+=(iproute2)
  [ -n "$PG_BIN" ] || missing+=(postgresql)
  if [ "${#missing[@]}" -gt 0 ]; then
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
}

# --- The network -------------------------------------------------------------------
ns_exists() { ip netns list | grep -qw "^$1"; }

network_up() {
  if ! ns_exists "$HUB"; then
    as_root ip netns add "$HUB"
    as_root ip -n "$HUB" link set lo up
    as_root ip -n "$HUB" link add br0 type bridge
    as_root ip -n "$HUB" addr add 10.77.0.1/24 dev br0
    as_root ip -n "$HUB" link set br0 up
  fi
  ns_exists "$SIDE" || { as_root ip netns add "$SIDE"; as_root ip -n "$SIDE" link set lo up; }
  local member i ns
  for member in $MEMBERS; do
    i=$(index_of "$member")
    ns=$(ns_of "$member")
    if ! ns_exists "$ns"; then
      as_root ip netns add "$ns"
      as_root ip -n "$ns" link set lo up
    fi
    if ! as_root ip -n "$ns" link show hub >/dev/null 2>&1; then
      as_root ip link add "hub$i" netns "$HUB" type veth peer name hub netns "$ns"
      as_root ip -n "$HUB" link set "hub$i" master br0 up
      as_root ip -n "$ns" addr add "10.77.0.1$i/24" dev hub
    fi
    as_root ip -n "$ns" link set hub up
    if ! as_root ip -n "$ns" link show side >/dev/null 2>&1; then
      as_root ip link add "side$i" netns "$SIDE" type veth peer name side netns "$ns"
      as_root ip -n "$SIDE" addr add "10.78.$i.1/24" dev "side$i"
      as_root ip -n "$SIDE" link set "side$i" up
      as_root ip -n "$ns" addr add "10.78.$i.2/24" dev side
      as_root ip -n "$ns" link set side up
    fi
  done
}

network_down() {
  local ns
  for ns in payonce-l1 payonce-l2 payonce-l3 "$SIDE" "$HUB"; do
    ns_exists "$ns" && as_root ip netns delete "$ns"
  done
  return 0
}

# --- HAProxy -----------------------------------------------------------------------
haproxy_pid() {
  local pid
  pid=$(cat "$STATE/haproxy.pid" 2>/dev/null | head -1) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

haproxy_up() {
  as_root mkdir -p "$STATE" "$LOGS"
  local servers="" side_servers="" member i
  for member in $MEMBERS; do
    i=$(index_of "$member")
    servers+="    server $member 10.77.0.1$i:5432 check port 8008 namespace $HUB"$'\n'
    side_servers+="    server $member 10.78.$i.2:5432 check port 8008 namespace $SIDE"$'\n'
  done
  # Patroni's documented HAProxy: a TCP proxy whose health check asks each node's REST
  # API whether it is the primary (200) or not (503). A node marked down has its
  # sessions shut, so the service's pool sees a dead connection at once instead of
  # writing into a demoted node until a statement times out.
  cat >"$STATE/haproxy.cfg.new" <<EOF
global
    maxconn 2000
    log stdout format raw local0 notice

defaults
    mode tcp
    log global
    retries 2
    timeout connect 2s
    # Pooled connections sit idle for long; the health check, not an idle timeout, is
    # what ends a connection to a node that is no longer the primary.
    timeout client 1h
    timeout server 1h
    timeout check 1s
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions

frontend ledger_write
    bind 127.0.0.1:$WRITE_PORT
    default_backend primary

backend primary
    option httpchk GET /primary
    http-check expect status 200
$servers
frontend ledger_side
    bind 127.0.0.1:$SIDE_PORT
    default_backend primary_by_side

backend primary_by_side
    option httpchk GET /primary
    http-check expect status 200
$side_servers
# The nodes' way to etcd: it listens on loopback only.
frontend etcd_relay
    bind 10.77.0.1:2379 namespace $HUB
    timeout client 10m
    default_backend etcd

backend etcd
    timeout server 10m
    server etcd 127.0.0.1:2379
EOF
  if haproxy_pid >/dev/null && cmp -s "$STATE/haproxy.cfg.new" "$STATE/haproxy.cfg"; then
    rm -f "$STATE/haproxy.cfg.new"
    return 0
  fi
  mv "$STATE/haproxy.cfg.new" "$STATE/haproxy.cfg"
  haproxy -c -q -f "$STATE/haproxy.cfg"
  local old
  if old=$(haproxy_pid); then
    kill "$old"
    while kill -0 "$old" 2>/dev/null; do sleep 0.1; done
  fi
  haproxy -D -f "$STATE/haproxy.cfg" -p "$STATE/haproxy.pid" >>"$LOGS/haproxy.log" 2>&1
}

# --- Patroni -----------------------------------------------------------------------
patroni_pid() {
  local pid
  pid=$(cat "$STATE/$1.patroni.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

postmaster_pid() {
  local pid
  pid=$(head -1 "$STATE/$1/data/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

patroni_config() {
  local member=$1 synchronous=$2 i
  i=$(index_of "$member")
  cat <<EOF
scope: $SCOPE
namespace: $ETCD_PREFIX
name: $member

restapi:
  listen: 0.0.0.0:8008
  connect_address: 10.77.0.1$i:8008

# etcd's v2 API, not v3: Debian's Patroni (3.0.2) renews a leader key on v3 with a plain
# put, so a primary that was stopped past its TTL overwrites its successor's key when it
# wakes — taking the lead back, and the successor's acknowledged commits are rewound away
# (upstream fixed it in 3.0.3). On v2 the renewal is a compare-and-swap on its own name.
etcd:
  hosts: 10.77.0.1:2379
  # 10.77.0.1 is a relay, not a member: the members etcd advertises are on loopback.
  use_proxies: true

bootstrap:
  dcs:
    ttl: $TTL
    loop_wait: $LOOP_WAIT
    retry_timeout: $RETRY_TIMEOUT
    maximum_lag_on_failover: 1048576
    # Synchronous: a commit is acknowledged once the synchronous standby has flushed it,
    # and only that standby may be promoted. Strict: with no standby at all the primary
    # waits rather than acknowledge a commit only it holds.
    synchronous_mode: $synchronous
    synchronous_mode_strict: $synchronous
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        # on: the standby has flushed the commit's WAL to its disk before the client hears
        # of it, so a failover or the loss of both machines' memory keeps it.
        # remote_apply would add visibility on the standby, which nothing here reads;
        # remote_write would lose a commit when both nodes crash at once.
        synchronous_commit: "on"
        max_connections: 300
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        wal_log_hints: "on"
        hot_standby: "on"
  initdb:
    - encoding: UTF8
    - data-checksums
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host all all 10.77.0.0/16 trust
    - host all all 10.78.0.0/16 trust
    - host replication replicator 10.77.0.0/16 trust
    - host replication replicator 127.0.0.1/32 trust

postgresql:
  listen: 10.77.0.1$i,10.78.$i.2,127.0.0.1:5432
  connect_address: 10.77.0.1$i:5432
  data_dir: $STATE/$member/data
  bin_dir: $PG_BIN
  pgpass: $STATE/$member/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: $STATE/$member
    fsync: "on"

tags:
  nofailover: false
  noloadbalance: false
EOF
}

patroni_up() {
  local member=$1 synchronous=$2 ns
  ns=$(ns_of "$member")
  patroni_pid "$member" >/dev/null && return 0
  as_root mkdir -p "$STATE/$member" "$LOGS"
  as_root chown postgres:postgres "$STATE/$member"
  as_root chmod 700 "$STATE/$member"
  patroni_config "$member" "$synchronous" | as_root tee "$STATE/$member.yml" >/dev/null
  as_root chown postgres:postgres "$STATE/$member.yml"
  # `ip netns exec` and setpriv both exec, so the pid recorded is Patroni's own.
  as_root start-stop-daemon --start --background --make-pidfile \
    --pidfile "$STATE/$member.patroni.pid" --output "$LOGS/$member.log" \
    --exec /usr/bin/ip -- netns exec "$ns" \
    setpriv --reuid=postgres --regid=postgres --init-groups \
    /usr/bin/patroni "$STATE/$member.yml"
}

# One member's own view, from inside its namespace (so it answers even when cut off).
member_view() {
  as_root ip netns exec "$(ns_of "$1")" \
    curl -sS --max-time 1 http://127.0.0.1:8008/patroni 2>/dev/null || true
}

# The cluster's configuration as Patroni holds it in etcd, read through the first member
# that answers.
dcs_config() {
  local member
  for member in $MEMBERS; do
    if as_root ip netns exec "$(ns_of "$member")" \
      curl -fsS --max-time 1 http://127.0.0.1:8008/config 2>/dev/null; then
      return 0
    fi
  done
  return 1
}

# Whether a primary serves through the write endpoint and, synchronous, a synchronous
# standby streams to it; and every member runs, so that a fault injected next finds the
# whole cluster (a member restarted by `up` after a kill first rewinds and catches up).
serving() {
  local synchronous=$1 member view leader=no sync=no timelines=""
  for member in $MEMBERS; do
    view=$(member_view "$member")
    [ -n "$view" ] || return 1
    [ "$(jq -r '.state' <<<"$view")" = running ] || return 1
    # On one timeline: a member still on an older one has yet to rewind and restart.
    timelines+="$(jq -r '.timeline' <<<"$view") "
    if [ "$(jq -r '.role + "/" + .state' <<<"$view")" = master/running ]; then leader=yes; fi
    if [ "$(jq -r '.sync_standby // false' <<<"$view")" = true ] &&
       [ "$(jq -r '.state' <<<"$view")" = running ]; then sync=yes; fi
  done
  [ "$leader" = yes ] || return 1
  [ "$(tr ' ' '\n' <<<"$timelines" | sort -u | grep -c .)" = 1 ] || return 1
  [ "$synchronous" = false ] || [ "$sync" = yes ] || return 1
  "$PG_BIN/psql" -X -q -At "postgresql://postgres@127.0.0.1:$WRITE_PORT/postgres?connect_timeout=2" \
    -c 'select not pg_is_in_recovery()' 2>/dev/null | grep -qx t
}

# A key of the cluster's, as Patroni keeps it in etcd (v2 API).
etcd_value() {
  curl -fsS --max-time 2 "http://127.0.0.1:2379/v2/keys$ETCD_PREFIX$SCOPE/$1" 2>/dev/null |
    jq -r '.node.value // empty'
}

# Debian's Patroni 3.0.2 can be left with a /sync key that names a former primary: a
# primary stopped past the TTL wakes mid-loop and writes it before it learns it was
# replaced. The real primary then refuses to touch a key "updated by someone else", so
# no standby is recorded as synchronous and none may be promoted — the cluster keeps
# replicating synchronously but can no longer fail over. The key is only a record the
# primary rewrites on its next loop: removing it is safe (without it no standby may be
# promoted either) and lets the primary record its standby again.
repair_sync_key() {
  local leader sync_leader
  leader=$(etcd_value leader)
  [ -n "$leader" ] || return 0
  sync_leader=$(etcd_value sync | jq -r '.leader // empty' 2>/dev/null || true)
  if [ -n "$sync_leader" ] && [ "$sync_leader" != "$leader" ]; then
    echo "ledger-cluster: /sync names $sync_leader, the primary is $leader: clearing it" >&2
    curl -fsS --max-time 2 -X DELETE "http://127.0.0.1:2379/v2/keys$ETCD_PREFIX$SCOPE/sync" >/dev/null
  fi
}

# The replication mode and Patroni's timing, as asked, in the cluster's configuration
# (Patroni's dynamic configuration in etcd: the members take it on their next loop).
set_mode() {
  local synchronous=$1 wanted current
  wanted=$(jq -cn --argjson sync "$synchronous" --argjson ttl "$TTL" \
    --argjson loop_wait "$LOOP_WAIT" --argjson retry_timeout "$RETRY_TIMEOUT" \
    '{synchronous_mode: $sync, synchronous_mode_strict: $sync, ttl: $ttl,
      loop_wait: $loop_wait, retry_timeout: $retry_timeout}')
  current=$(dcs_config | jq -c '{synchronous_mode: (.synchronous_mode // false),
    synchronous_mode_strict: (.synchronous_mode_strict // false), ttl, loop_wait,
    retry_timeout}') || return 1
  [ "$current" = "$wanted" ] && return 0
  local member
  for member in $MEMBERS; do
    if as_root ip netns exec "$(ns_of "$member")" curl -fsS --max-time 3 -X PATCH \
      -H 'Content-Type: application/json' -d "$wanted" \
      http://127.0.0.1:8008/config >/dev/null 2>&1; then
      return 1 # applied; checked again on the next round
    fi
  done
  return 1
}

cmd_up() {
  local synchronous=true
  case "${1:-}" in
    --async) synchronous=false ;;
    "") ;;
    *) die "up takes only --async" ;;
  esac
  install_missing
  curl -fsS --max-time 2 http://127.0.0.1:2379/v2/keys/ >/dev/null 2>&1 ||
    die "etcd's v2 API does not answer on 127.0.0.1:2379: run scripts/services.sh first"
  network_up
  haproxy_up
  local member
  # The first member alone bootstraps (initdb); the others then copy it. Started together
  # they would race for the initialize key and the losers wait for the winner anyway.
  local deadline=$((SECONDS + 120))
  patroni_up pg1 "$synchronous"
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ -n "$(member_view pg1)" ] && dcs_config >/dev/null 2>&1 && break
    patroni_pid pg1 >/dev/null || die "pg1's Patroni exited (see $LOGS/pg1.log)"
    sleep 0.2
  done
  for member in pg2 pg3; do patroni_up "$member" "$synchronous"; done
  # Serving on two looks a second apart: a member that rejoined after a fault may still
  # be rewound and restarted by its Patroni a moment after it first shows as running.
  local steady=0
  while [ "$SECONDS" -lt "$deadline" ] && [ "$steady" -lt 2 ]; do
    if set_mode "$synchronous" 2>/dev/null && serving "$synchronous"; then
      steady=$((steady + 1))
      [ "$steady" -lt 2 ] && sleep 1
      continue
    fi
    steady=0
    [ "$synchronous" = false ] || repair_sync_key
    sleep 0.2
  done
  [ "$steady" -ge 2 ] || die "no primary serves on 127.0.0.1:$WRITE_PORT after 120 s (see $LOGS)"
  echo "postgres://postgres@127.0.0.1:$WRITE_PORT/postgres"
}

cmd_status() {
  local member view members="[]" ppid pgpid
  for member in $MEMBERS; do
    view=$(member_view "$member")
    ppid=$(patroni_pid "$member" || true)
    pgpid=$(postmaster_pid "$member" || true)
    members=$(jq -c --arg name "$member" --arg ns "$(ns_of "$member")" \
      --arg host "10.77.0.1$(index_of "$member")" \
      --arg pid "$pgpid" --arg patroni_pid "$ppid" --argjson view "${view:-null}" '
      . + [{
        name: $name,
        role: (if $view == null then "unknown"
               elif ($view.role == "master" or $view.role == "primary") then "leader"
               elif ($view.sync_standby // false) then "sync_standby"
               else "replica" end),
        state: (if $view == null then "unreachable" else $view.state end),
        pid: ($pid | if . == "" then null else tonumber end),
        patroni_pid: ($patroni_pid | if . == "" then null else tonumber end),
        timeline: (if $view == null then null else $view.timeline end),
        namespace: $ns,
        host: $host
      }]' <<<"$members")
  done
  local mode
  mode=$(dcs_config 2>/dev/null | jq -r 'if .synchronous_mode then "sync" else "async" end' ||
    echo unknown)
  jq -n --argjson members "$members" --arg mode "$mode" \
    --arg write "postgres://postgres@127.0.0.1:$WRITE_PORT/postgres" \
    --arg side "postgres://postgres@127.0.0.1:$SIDE_PORT/postgres" \
    '{members: $members, replication: $mode, write_url: $write, side_url: $side}'
}

cmd_down() {
  local member pid
  for member in $MEMBERS; do
    # SIGCONT first: a frozen node would never act on the SIGTERM.
    if ns_exists "$(ns_of "$member")"; then
      for pid in $(as_root ip netns pids "$(ns_of "$member")"); do kill -CONT "$pid" 2>/dev/null || true; done
    fi
    if pid=$(patroni_pid "$member"); then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for _ in $(seq 150); do
    local alive=no
    for member in $MEMBERS; do patroni_pid "$member" >/dev/null && alive=yes; done
    [ "$alive" = no ] && break
    sleep 0.2
  done
  for member in $MEMBERS; do
    if ns_exists "$(ns_of "$member")"; then
      for pid in $(as_root ip netns pids "$(ns_of "$member")"); do kill -KILL "$pid" 2>/dev/null || true; done
    fi
  done
  if pid=$(haproxy_pid); then kill "$pid"; fi
  network_down
  # The cluster's keys in etcd.
  curl -fsS --max-time 3 -X DELETE "http://127.0.0.1:2379/v2/keys${ETCD_PREFIX%/}?recursive=true" \
    >/dev/null 2>&1 || true
  as_root rm -rf "$STATE"
}

cmd_fault() {
  local action=$1 member=${2:-} ns pid
  [ -n "$member" ] || die "$action takes a member's name (pg1, pg2, pg3)"
  ns=$(ns_of "$member")
  case "$action" in
    kill)
      for pid in $(patroni_pid "$member" || true) $(postmaster_pid "$member" || true); do
        kill -KILL "$pid"
      done ;;
    freeze) for pid in $(as_root ip netns pids "$ns"); do kill -STOP "$pid"; done ;;
    thaw) for pid in $(as_root ip netns pids "$ns"); do kill -CONT "$pid"; done ;;
    cut) as_root ip -n "$ns" link set hub down ;;
    heal) as_root ip -n "$ns" link set hub up ;;
  esac
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  kill | freeze | thaw | cut | heal) cmd_fault "$@" ;;
  *) die "usage: $0 up [--async] | status | down | kill|freeze|thaw|cut|heal MEMBER" ;;
esac
