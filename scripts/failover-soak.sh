#!/usr/bin/env bash
# The failover soak: servers killed (kill -9) and slots moved under load from several client
# processes, each writing a history of its calls, checked afterwards by scripts/check_history.py.
# Not part of ctest or CI (each mode starts its own servers and runs for about a minute).
#
#   scripts/failover-soak.sh [--modes MODE,...] [--seconds 15] [--clients 3] [--threads 4]
#                            [--build-dir build/release] [--out DIR]
#
# Modes (default: all, in this order; each in its own scripts/servers.sh run, since a mode
# leaves its servers broken):
#   redis-cluster-kill     kill -9 one of the three Redis Cluster primaries; its replica takes over
#   redis-cluster-kill-wait       the same with min_replicas=1 (every write waits for its
#                          replica); checked as durable (nothing acknowledged may go)
#   redis-cluster-migrate  every idem key in one slot (a hash tag in the prefix); the slot is moved
#                          to another primary under load (SETSLOT IMPORTING/MIGRATING, MIGRATE of
#                          its keys a few at a time, SETSLOT NODE); checked as durable (no
#                          server dies: nothing acknowledged may go)
#   redis-sentinel-kill    kill -9 the primary of a Sentinel group; the sentinels promote the
#                          replica (skipped when this idem refuses redis+sentinel:// URLs)
#   redis-sentinel-kill-wait      the same with min_replicas=1; checked as durable
#   redis-sentinel-kill-restart   the same without min_replicas, and the old primary started
#                          again at once as it was configured (a primary, empty: these nodes
#                          have no persistence), as a service manager would restart it
#   postgres-kill-promote  kill -9 the PostgreSQL primary (postmaster and backends), promote its
#                          synchronous standby; checked as durable (nothing acknowledged may go)
#   postgres-async-kill-promote   the same with an asynchronous standby (losses counted only)
#
# Per mode: --clients idem_history_client processes of --threads threads each run --seconds of
# calls; the fault comes at a third of it; the script waits (at most 60 s) until the servers
# serve again (a killed Redis node is then started again, empty, and waited for until it
# replicates from its successor: min_replicas=1 needs a replica), the clients end with their
# final re-reads, and check_history.py checks the
# histories. At the end, a table of the figures per mode. The exit status is 1 when a mode's
# check failed (or a client ended badly), 0 otherwise. Histories and logs stay in --out
# (default build/failover-soak).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit "${1:-0}"
}

all_modes=redis-cluster-kill,redis-cluster-kill-wait,redis-cluster-migrate,redis-sentinel-kill
all_modes+=,redis-sentinel-kill-wait,redis-sentinel-kill-restart,postgres-kill-promote
all_modes+=,postgres-async-kill-promote
modes=$all_modes
seconds=15
clients=3
threads=4
build_dir=build/release
out=build/failover-soak
inside=
while [ $# -gt 0 ]; do
  case "$1" in
    --modes) modes=${2:?--modes needs a value}; shift 2 ;;
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --clients) clients=${2:?--clients needs a value}; shift 2 ;;
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --inside) inside=${2:?}; shift 2 ;;  # internal: one mode, run under scripts/servers.sh
    -h|--help) usage 0 ;;
    *) echo "failover-soak.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
client=$build_dir/soak/idem_history_client

log() { echo "failover-soak: $*" >&2; }

# ---- faults and recovery checks (run inside scripts/servers.sh) -----------------------------

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
kill9() {
  local pid=$1
  [ -n "$pid" ] || { log "no pid to kill"; return 1; }
  log "kill -9 $pid"
  kill -KILL "$pid"
}

# within SECONDS CHECK...: runs CHECK every 0.2 s until it succeeds; false after SECONDS.
within() {
  local limit=$1; shift
  local tries=$((limit * 5)) try
  for ((try = 0; try < tries; try++)); do
    "$@" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

cluster_ports=()
cluster_nodes() { redis-cli -p "$1" cluster nodes; }
# The cluster serves every slot again: three primaries with slots, none failed, state ok, as
# seen from the second primary (the first is the one killed).
cluster_recovered() {
  local port=${cluster_ports[1]}
  redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' || return 1
  [ "$(cluster_nodes "$port" | awk '$3 ~ /master/ && $3 !~ /fail/ && NF > 8' | wc -l)" = 3 ]
}

fault_redis_cluster_kill() {
  local victim=${cluster_ports[0]}
  kill9 "$(pid_in "$IDEM_TEST_REDIS_CLUSTER_DIR/$victim/redis.pid")"
  # The node must first be seen failed (node timeout 2 s), then the cluster whole again.
  within 30 sh -c "redis-cli -p ${cluster_ports[1]} cluster nodes | grep -q 'fail '" &&
    within 60 cluster_recovered
}
# The killed node started again (empty: no persistence): it rejoins as its successor's replica.
restore_redis_cluster_kill() {
  restart_as_replica "$IDEM_TEST_REDIS_CLUSTER_DIR" "${cluster_ports[0]}"
}

# restart_as_replica DIR PORT [ARGS...]: starts the redis-server of DIR/PORT/redis.conf again
# (with ARGS) and waits until it replicates from the primary that replaced it.
restart_as_replica() {
  local dir=$1 port=$2
  shift 2
  redis-server "$dir/$port/redis.conf" "$@" >/dev/null
  within 60 sh -c "redis-cli -p $port info replication | grep -q '^master_link_status:up'"
}

# The node (id and port) serving slot $2, asked of the node at port $1.
slot_owner() {
  cluster_nodes "$1" | awk -v slot="$2" '$3 ~ /master/ && $3 !~ /fail/ {
    for (i = 9; i <= NF; i++) {
      n = split($i, r, "-"); lo = r[1]; hi = (n == 2 ? r[2] : r[1]);
      if ($i !~ /^\[/ && slot + 0 >= lo + 0 && slot + 0 <= hi + 0) {
        split($2, a, "[:@]"); print $1, a[2]; exit
      }
    }
  }'
}

fault_redis_cluster_migrate() {
  local seed=${cluster_ports[0]} slot src_id src_port dst_id dst_port port keys moved=0 i
  slot=$(redis-cli -p "$seed" cluster keyslot hist)
  read -r src_id src_port < <(slot_owner "$seed" "$slot")
  for port in "${cluster_ports[@]:0:3}"; do
    [ "$port" = "$src_port" ] && continue
    dst_port=$port
    dst_id=$(redis-cli -p "$port" cluster myid)
    break
  done
  log "moving slot $slot ($(redis-cli -p "$src_port" cluster countkeysinslot "$slot") keys) from $src_port to $dst_port"
  redis-cli -p "$dst_port" cluster setslot "$slot" importing "$src_id" >/dev/null
  redis-cli -p "$src_port" cluster setslot "$slot" migrating "$dst_id" >/dev/null
  for ((i = 0; i < 5000; i++)); do
    mapfile -t keys < <(redis-cli -p "$src_port" cluster getkeysinslot "$slot" 200)
    [ "${#keys[@]}" -gt 0 ] && [ -n "${keys[0]}" ] || break
    redis-cli -p "$src_port" migrate 127.0.0.1 "$dst_port" "" 0 5000 keys "${keys[@]}" |
      grep -qx 'OK\|NOKEY' || { log "MIGRATE failed"; return 1; }
    moved=$((moved + ${#keys[@]}))
    sleep 0.05  # a few keys at a time: the slot stays half-moved for a while under load
  done
  for port in "$dst_port" "$src_port" "${cluster_ports[@]:0:3}"; do
    redis-cli -p "$port" cluster setslot "$slot" node "$dst_id" >/dev/null
  done
  log "moved $moved keys"
  slot_moved() { [ "$(slot_owner "$seed" "$slot" | cut -d' ' -f2)" = "$dst_port" ]; }
  within 30 slot_moved
}

fault_redis_sentinel_kill() {
  local data_ports=($IDEM_TEST_REDIS_SENTINEL_DATA_PORTS) sentinels=($IDEM_TEST_REDIS_SENTINEL_PORTS)
  kill9 "$(pid_in "$IDEM_TEST_REDIS_SENTINEL_DIR/${data_ports[0]}/redis.pid")"
  within 60 sh -c "redis-cli -p ${sentinels[0]} sentinel get-master-addr-by-name $IDEM_TEST_REDIS_SENTINEL_MASTER | grep -qx ${data_ports[1]} &&
    redis-cli -p ${data_ports[1]} role | head -n 1 | grep -qx master"
}
# The same, and the old primary started again at once as it was configured, a primary (as a
# service manager would restart it): empty, since these nodes have no persistence.
fault_redis_sentinel_kill_restart() {
  local data_ports=($IDEM_TEST_REDIS_SENTINEL_DATA_PORTS)
  fault_redis_sentinel_kill || return 1
  redis-server "$IDEM_TEST_REDIS_SENTINEL_DIR/${data_ports[0]}/redis.conf" >/dev/null
  log "the old primary is back, empty, as a primary"
  within 10 sh -c "redis-cli -p ${data_ports[0]} ping | grep -qx PONG"
}

# The old primary started again as the new primary's replica. Not as a primary: without
# persistence it comes back empty, and the sentinels leave it a second primary for a while
# (Redis's advice: a node without persistence must not restart as a primary by itself).
restore_redis_sentinel_kill() {
  local data_ports=($IDEM_TEST_REDIS_SENTINEL_DATA_PORTS)
  restart_as_replica "$IDEM_TEST_REDIS_SENTINEL_DIR" "${data_ports[0]}" \
    --replicaof 127.0.0.1 "${data_ports[1]}"
}

fault_postgres_kill_promote() {
  local data=${IDEM_TEST_PG_CTL_CMD##* -D } postmaster children
  postmaster=$(pid_in "$data/postmaster.pid")
  # The postmaster and its backends at once, as a machine failing would take them.
  children=$(ps -o pid= --ppid "$postmaster" | tr '\n' ' ')
  log "kill -9 $postmaster (postmaster) $children(backends)"
  # shellcheck disable=SC2086
  kill -KILL "$postmaster" $children
  sleep 1  # the clients see the primary gone before the standby is promoted
  as_pg $IDEM_TEST_PG_STANDBY_CTL_CMD -W promote >/dev/null
  within 60 sh -c "[ \"\$(psql -qtA -h 127.0.0.1 -p $IDEM_TEST_POSTGRES_STANDBY_PORT -U idem -d idem_test -c 'SELECT pg_is_in_recovery()')\" = f ]"
}

run_mode() {
  local mode=$1
  local url durable=() fault dir="$out/$mode"
  rm -rf "$dir"
  mkdir -p "$dir/servers"
  cluster_ports=($IDEM_TEST_REDIS_CLUSTER_PORTS)
  case "$mode" in
    redis-cluster-kill) url=$IDEM_TEST_REDIS_CLUSTER_URL; fault=fault_redis_cluster_kill ;;
    redis-cluster-migrate)
      url="$IDEM_TEST_REDIS_CLUSTER_URL?prefix=%7Bhist%7D:"; durable=(--durable)
      fault=fault_redis_cluster_migrate ;;
    redis-cluster-kill-wait)
      url="$IDEM_TEST_REDIS_CLUSTER_URL?min_replicas=1"; durable=(--durable)
      fault=fault_redis_cluster_kill ;;
    redis-sentinel-kill) url=$IDEM_TEST_REDIS_SENTINEL_URL; fault=fault_redis_sentinel_kill ;;
    redis-sentinel-kill-restart)
      url=$IDEM_TEST_REDIS_SENTINEL_URL; fault=fault_redis_sentinel_kill_restart ;;
    redis-sentinel-kill-wait)
      url="$IDEM_TEST_REDIS_SENTINEL_URL?min_replicas=1"; durable=(--durable)
      fault=fault_redis_sentinel_kill ;;
    postgres-kill-promote)
      url=$IDEM_TEST_POSTGRES_FAILOVER_URL; durable=(--durable); fault=fault_postgres_kill_promote ;;
    postgres-async-kill-promote)
      url=$IDEM_TEST_POSTGRES_FAILOVER_URL; fault=fault_postgres_kill_promote ;;
    *) log "unknown mode $mode"; return 2 ;;
  esac
  local pids=() i
  for ((i = 1; i <= clients; i++)); do
    "$client" --url "$url" --seconds "$seconds" --process-id "$i" --out "$dir/p$i.jsonl" \
      --threads "$threads" --final-seconds 60 >"$dir/p$i.log" 2>&1 &
    pids+=($!)
  done
  sleep $((seconds / 3))
  local refused=0
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      local status=0
      wait "$pid" || status=$?
      [ "$status" = 4 ] && refused=1
    fi
  done
  if [ "$refused" = 1 ]; then
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    log "$mode: skipped, the URL was refused: $(head -n 1 "$dir/p1.log")"
    echo "{\"mode\": \"$mode\", \"skipped\": true}" >"$dir/figures.json"
    return 0
  fi
  local started=$SECONDS recovered=yes restored=-
  log "$mode: fault at ${seconds}/3 s"
  "$fault" || recovered=no
  local took=$((SECONDS - started))
  log "$mode: recovered=$recovered after $took s"
  if [ "$recovered" = yes ] && [ "$(type -t "restore_${fault#fault_}")" = function ]; then
    "restore_${fault#fault_}" || recovered=no
    restored=$((SECONDS - started))
    log "$mode: the killed server is back as a replica after $restored s"
  fi
  echo "$recovered $took $restored" >"$dir/recovery"
  # The clients end by themselves (bounded loop, final re-reads at most 60 s, each call watched);
  # one still running well past that is stuck: killed, its open call stays without an outcome.
  local client_failed=0 deadline=$((SECONDS + seconds + 120))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$mode: client $pid still running: killed"
      kill -KILL "$pid"
    fi
    local status=0
    wait "$pid" || status=$?
    [ "$status" = 0 ] || { log "$mode: client $pid exited $status"; client_failed=1; }
  done
  # The servers' logs, kept with the histories (servers.sh removes its directory on exit).
  local logs
  logs=$(realpath "$dir/servers")
  (cd "$IDEM_TEST_SERVERS_DIR" &&
    find . -name '*.log' -size -50M -exec cp --parents {} "$logs/" \;) 2>/dev/null || true
  local check=0
  python3 scripts/check_history.py --mode "$mode" "${durable[@]}" --json "$dir/figures.json" \
    "$dir"/p*.jsonl || check=$?
  [ "$recovered" = yes ] || { log "$mode: the servers did not recover"; check=1; }
  [ "$client_failed" = 0 ] || check=1
  return "$check"
}

if [ -n "$inside" ]; then
  run_mode "$inside"
  exit $?
fi

# ---- the outer run: build once, then one servers.sh run per mode ------------------------------

if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  if [ "$build_dir" = build/release ]; then
    cmake --preset release >/dev/null
  else
    log "$build_dir is not a configured build tree"
    exit 2
  fi
fi
cmake -S . -B "$build_dir" >/dev/null
cmake --build "$build_dir" -j2 --target idem_history_client

mkdir -p "$out"
status=0
IFS=, read -r -a selected <<<"$modes"
for mode in "${selected[@]}"; do
  case ",$all_modes," in *,"$mode",*) ;; *) log "unknown mode $mode"; exit 2 ;; esac
  env=(IDEM_TEST_POSTGRES_STANDBY=1 IDEM_TEST_REDIS_SENTINEL=1)
  [ "$mode" = postgres-kill-promote ] && env+=(IDEM_TEST_POSTGRES_SYNC=1)
  log "mode $mode"
  env "${env[@]}" scripts/servers.sh "$PWD/scripts/failover-soak.sh" --inside "$mode" --seconds "$seconds" \
    --clients "$clients" --threads "$threads" --build-dir "$build_dir" --out "$out" || status=1
done

python3 - "$out" "${selected[@]}" <<'PY'
import json, os, sys
out, modes = sys.argv[1], sys.argv[2:]
cols = ["calls", "ok", "in_doubt", "retryable", "fatal", "lost", "doubled", "stale", "never_ended", "final_unread"]
print("| mode | " + " | ".join(c.replace("_", " ") for c in cols) + " | recovery | check |")
print("|---" * (len(cols) + 3) + "|")
for mode in modes:
    path = os.path.join(out, mode, "figures.json")
    if not os.path.exists(path):
        print(f"| {mode} | " + " | ".join("-" for _ in cols) + " | - | no figures |")
        continue
    figures = json.load(open(path))
    if figures.get("skipped"):
        print(f"| {mode} | " + " | ".join("-" for _ in cols) + " | - | skipped |")
        continue
    recovery = "-"
    rec = os.path.join(out, mode, "recovery")
    if os.path.exists(rec):
        ok, secs, restored = open(rec).read().split()
        recovery = f"{secs} s" if ok == "yes" else "none"
        if ok == "yes" and restored != "-":
            recovery += f" (replica again: {restored} s)"
    check = "FAIL" if figures["violations"] else "PASS"
    print(f"| {mode} | " + " | ".join(str(figures[c]) for c in cols) + f" | {recovery} | {check} |")
PY
exit "$status"
