#!/usr/bin/env bash
# The Redis backend on a Redis Cluster, with min_replicas, and through a failover: starts its own
# servers on free loopback ports and prints medians of RUNS runs and the ratios.
#
#   bench/redis_cluster_bench.sh
#   CLIENTS="8" PIPELINE="1 16" REQUESTS=50000 RUNS=3 RECOVERY_RUNS=3 bench/redis_cluster_bench.sh
#   PARTS="1 2" bench/redis_cluster_bench.sh                 # only parts 1 and 2 below
#
# 1. Cluster throughput, on three primaries with a replica each (cluster-node-timeout 2000, as in
#    scripts/servers.sh). Marks: C threads, mark_processed (P = 1) or mark_processed_batch of P
#    fresh ids; next to `redis-benchmark --cluster -c C -P P` sending
#      SET idem:m:{tag}bench:00000000000000000000<12 random digits> 1893456000000 NX
#    (its {tag} becomes a hash tag of the node each connection is bound to, so the keys are within
#    two bytes as long as idem's marker keys, idem:m:{bench:<32 hex>}), and next to raw hiredis
#    with one connection per primary in each of C threads sending idem's own SET NX commands
#    routed by slot (BM_RawMarks). Replays: C threads, each a store claim of a completed record
#    (one GET), cycling over 1000 completed keys; next to redis-benchmark GET of 1000 keys holding
#    values of the same length, and raw hiredis GET of idem's record keys.
# 2. One node, and what WAIT costs: a primary with one replica of its own (no cluster). On
#    redis://.../0 the marks and replays of 1. next to raw hiredis (the one-node figures to set
#    beside the cluster's), then the marks, recorder claim + complete and store claim + complete
#    of new keys there and on redis://.../0?min_replicas=1&replica_timeout=500ms.
# 3. Recovery after kill -9 of a primary, RECOVERY_RUNS times each on a fresh cluster and a fresh
#    Sentinel group (primary, replica, three sentinels, quorum 2, down-after-milliseconds 1000, as
#    in scripts/servers.sh): bench_redis_cluster --mode=recover marks on the killed primary's
#    slots (cluster) or through redis+sentinel:// with connect/command timeouts of 100/200 ms and
#    prints the time from the SIGKILL to the first mark that succeeds, and to the moment the
#    servers name the new primary (CLUSTER SLOTS of another primary, SENTINEL
#    get-master-addr-by-name), polled every 10 ms.
#
# Every node is flushed before every throughput run. Build: IDEM_BUILD_DIR (default build/release,
# configured with the release preset when missing). The client and every server share this
# machine's cores: on a small machine the cluster cannot beat one node (see BENCHMARKS.md).
# Takes about 5 minutes with the defaults on 2 cores, 8 with RUNS=5.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

clients=${CLIENTS:-"8"}
pipelines=${PIPELINE:-"1 16"}
requests=${REQUESTS:-50000}
runs=${RUNS:-3}
recovery_runs=${RECOVERY_RUNS:-$runs}
parts=" ${PARTS:-1 2 3} "
replay_keys=1000
build_dir=${IDEM_BUILD_DIR:-build/release}
bench=$build_dir/bench/bench_redis_cluster
[ "$runs" -ge 3 ] && [ "$recovery_runs" -ge 3 ] ||
  { echo "RUNS and RECOVERY_RUNS must be >= 3 (medians)" >&2; exit 2; }

need_tools redis_cluster_bench "" redis-server redis-cli redis-benchmark python3
build_missing "$bench" "$build_dir" bench_redis_cluster "$(nproc)"

work=$(mktemp -d /tmp/idem-redis-cluster-bench-XXXXXX)
# Every redis-server this script starts writes its pid to $work/<group>/<port>/redis.pid.
# stop_group DIR: the sentinels first (so none starts a failover), then the data nodes.
stop_group() {
  local file
  for file in "$1"/*/sentinel; do
    [ -e "$file" ] && stop_pid "$(pid_in "$(dirname "$file")/redis.pid")"
  done
  for file in "$1"/*/redis.pid; do
    [ -e "$file" ] && stop_pid "$(pid_in "$file")"
  done
  return 0
}
cleanup() {
  set +e
  local group
  for group in "$work"/*/; do stop_group "$group"; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# redis_start DIR PORT [CONFIG LINES...]: a daemonized redis-server without persistence.
redis_start() {
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  printf '%s\n' "port $port" "bind 127.0.0.1" "protected-mode no" "daemonize yes" \
    "pidfile $dir/redis.pid" "logfile $dir/redis.log" "dir $dir" 'save ""' "appendonly no" \
    "repl-diskless-sync-delay 0" "$@" >"$dir/redis.conf"
  redis-server "$dir/redis.conf" >/dev/null
  within_30s redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 || {
    echo "redis_cluster_bench: redis-server on $port did not start" >&2
    cat "$dir/redis.log" >&2
    exit 1
  }
}
rcli() { redis-cli -h 127.0.0.1 -p "$@"; }

# start_cluster GROUP: three primaries and a replica each; sets cluster_ports (primaries first).
start_cluster() {
  local group=$work/$1 ports i
  mapfile -t ports < <(free_port 12)
  cluster_ports=("${ports[@]:0:6}")
  for i in 0 1 2 3 4 5; do
    redis_start "$group/${ports[$i]}" "${ports[$i]}" "cluster-enabled yes" \
      "cluster-config-file nodes.conf" "cluster-node-timeout 2000" \
      "cluster-port ${ports[$((i + 6))]}"
  done
  redis-cli --cluster create "${cluster_ports[@]/#/127.0.0.1:}" --cluster-replicas 1 \
    --cluster-yes >"$group/create.log" 2>&1 </dev/null || {
    echo "redis_cluster_bench: the cluster was not formed" >&2
    cat "$group/create.log" >&2
    exit 1
  }
  within_30s cluster_ready ||
    { echo "redis_cluster_bench: the cluster did not become ready in 30 s" >&2; exit 1; }
  cluster_url="redis+cluster://$(printf '127.0.0.1:%s,' "${cluster_ports[@]:0:3}")"
  cluster_url="${cluster_url%,}/0"
}
cluster_ready() {
  local i info
  for i in 0 1 2 3 4 5; do
    info=$(rcli "${cluster_ports[$i]}" cluster info 2>/dev/null) || return 1
    [[ $info == *cluster_state:ok* && $info == *cluster_known_nodes:6* ]] || return 1
    # Every node sees three replicas, none failing or in handshake.
    rcli "${cluster_ports[$i]}" cluster nodes 2>/dev/null | awk '
      $3 ~ /fail|handshake|noaddr/ || $8 != "connected" { bad = 1 }
      $3 ~ /slave/ { n++ }
      END { exit bad || n != 3 }' || return 1
    info=$(rcli "${cluster_ports[$i]}" info replication 2>/dev/null) || return 1
    if [ "$i" -lt 3 ]; then
      [[ $info == *role:master*connected_slaves:1*state=online* ]] || return 1
    else
      [[ $info == *role:slave*master_link_status:up* ]] || return 1
    fi
  done
}
# start_pair GROUP: a primary and its replica; sets pair_ports.
start_pair() {
  local group=$work/$1
  mapfile -t pair_ports < <(free_port 2)
  redis_start "$group/${pair_ports[0]}" "${pair_ports[0]}"
  redis_start "$group/${pair_ports[1]}" "${pair_ports[1]}" "replicaof 127.0.0.1 ${pair_ports[0]}"
  within_30s replica_up "${pair_ports[1]}" ||
    { echo "redis_cluster_bench: the replica did not sync in 30 s" >&2; exit 1; }
}
replica_up() { rcli "$1" info replication 2>/dev/null | grep -q '^master_link_status:up'; }
# start_sentinels GROUP: a pair and three sentinels monitoring its primary as "idem"; sets
# sentinel_url (and pair_ports).
start_sentinels() {
  local group=$work/$1 port
  start_pair "$1"
  mapfile -t sentinel_ports < <(free_port 3)
  for port in "${sentinel_ports[@]}"; do
    mkdir -p "$group/$port"
    : >"$group/$port/sentinel"  # stop_group stops these first
    printf '%s\n' "port $port" "bind 127.0.0.1" "protected-mode no" "daemonize yes" \
      "pidfile $group/$port/redis.pid" "logfile $group/$port/redis.log" "dir $group/$port" \
      "sentinel resolve-hostnames no" "sentinel monitor idem 127.0.0.1 ${pair_ports[0]} 2" \
      "sentinel down-after-milliseconds idem 1000" "sentinel failover-timeout idem 5000" \
      >"$group/$port/redis.conf"
    redis-server "$group/$port/redis.conf" --sentinel >/dev/null
  done
  within_30s sentinels_ready ||
    { echo "redis_cluster_bench: the sentinels did not become ready in 30 s" >&2; exit 1; }
  sentinel_url="redis+sentinel://$(printf '127.0.0.1:%s,' "${sentinel_ports[@]}")"
  sentinel_url="${sentinel_url%,}/idem"
}
sentinels_ready() {
  local port
  for port in "${sentinel_ports[@]}"; do
    rcli "$port" sentinel master idem 2>/dev/null | awk '
      key == "flags" { ok += $0 == "master" }
      key == "num-slaves" { ok += $0 == 1 }
      key == "num-other-sentinels" { ok += $0 == 2 }
      { key = (key == "" ? $0 : "") }
      END { exit ok != 3 }' || return 1
  done
}
flush() {
  local port
  for port in "$@"; do rcli "$port" flushall >/dev/null; done
}
# gbench_rates JSON: "name rate" per benchmark; fails on a benchmark that reported an error.
gbench_rates() {
  python3 - "$1" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("error_occurred"):
        sys.exit(f"redis_cluster_bench: {b['name']}: {b.get('error_message')}")
    print(b["name"].split("/")[0], b["items_per_second"])
PY
}
run_bench() {  # run_bench URL FILTER CLIENTS PIPELINE
  "$bench" --url="$1" --benchmark_filter="$2" --clients="$3" --pipeline="$4" \
    --requests="$requests" --replay-keys="$replay_keys" --benchmark_format=json \
    --benchmark_out="$work/gbench.json" --benchmark_out_format=json >/dev/null
  gbench_rates "$work/gbench.json"
}
rb_rate() { tail -n 1 | cut -d, -f2 | tr -d '"'; }

results=$work/results.txt
: >"$results"
load() { cut -d' ' -f1 /proc/loadavg; }
echo "load average at start: $(load)" >&2

# ---- 1. cluster throughput -------------------------------------------------------------------
if [[ $parts == *" 1 "* ]]; then
start_cluster cluster
primaries=("${cluster_ports[@]:0:3}")
echo "cluster on ${cluster_ports[*]}" >&2
for run in $(seq 1 "$runs"); do
  for c in $clients; do
    for p in $pipelines; do
      flush "${primaries[@]}"
      rb=$(redis-benchmark --cluster -h 127.0.0.1 -p "${primaries[0]}" -c "$c" -n "$requests" \
             -P "$p" -r 1000000000 --csv \
             SET 'idem:m:{tag}bench:00000000000000000000__rand_int__' 1893456000000 NX | rb_rate)
      flush "${primaries[@]}"
      run_bench "$cluster_url" "BM_(Idem|Raw)Marks/c:$c/p:$p/" "$c" "$p" >"$work/rates"
      while read -r name rate; do
        echo "marks $c $p $run $name $rate" >>"$results"
      done <"$work/rates"
      echo "marks $c $p $run redis-benchmark $rb" >>"$results"
      echo "cluster marks c=$c p=$p run $run: redis-benchmark ${rb%.*}/s," \
        "$(grep "^marks $c $p $run BM" "$results" | awk '{printf "%s %d/s ", $5, $6}')" >&2
    done
    # Replays: idem completes its 1000 keys, then replays them; redis-benchmark GETs 1000 keys of
    # its own holding values as long as idem's records.
    flush "${primaries[@]}"
    run_bench "$cluster_url" "BM_(Idem|Raw)Replays/c:$c/" "$c" 1 >"$work/rates"
    while read -r name rate; do
      echo "replays $c 1 $run $name $rate" >>"$results"
    done <"$work/rates"
    length=$(redis-cli -c -h 127.0.0.1 -p "${primaries[0]}" strlen 'idem:s:{replay:000000000000}')
    value=$(head -c "$length" /dev/zero | tr '\0' x)
    flush "${primaries[@]}"
    redis-benchmark --cluster -h 127.0.0.1 -p "${primaries[0]}" -c 3 -n $((replay_keys * 30)) \
      -r "$replay_keys" SET 'idem:s:{tag}replay:__rand_int__' "$value" >/dev/null
    rb=$(redis-benchmark --cluster -h 127.0.0.1 -p "${primaries[0]}" -c "$c" -n "$requests" \
           -r "$replay_keys" --csv GET 'idem:s:{tag}replay:__rand_int__' | rb_rate)
    echo "replays $c 1 $run redis-benchmark $rb" >>"$results"
    echo "cluster replays c=$c run $run (records of $length bytes): redis-benchmark ${rb%.*}/s," \
      "$(grep "^replays $c 1 $run BM" "$results" | awk '{printf "%s %d/s ", $5, $6}')" >&2
  done
done
stop_group "$work/cluster"
fi

# ---- 2. one node, and WAIT 1 -----------------------------------------------------------------
if [[ $parts == *" 2 "* ]]; then
start_pair pair
echo "primary ${pair_ports[0]} with replica ${pair_ports[1]}" >&2
plain_url="redis://127.0.0.1:${pair_ports[0]}/0"
wait_url="$plain_url?min_replicas=1&replica_timeout=500ms"
for run in $(seq 1 "$runs"); do
  for c in $clients; do
    for mode in plain wait; do
      # Without WAIT, also raw hiredis and the replays: the one-node figures beside the cluster's.
      url=$plain_url raw="(Idem|Raw)" replays="(Idem|Raw)Replays|"
      [ "$mode" = wait ] && url=$wait_url raw=Idem replays=
      for p in $pipelines; do
        flush "${pair_ports[0]}"
        run_bench "$url" "BM_${raw}Marks/c:$c/p:$p/" "$c" "$p" >"$work/rates"
        while read -r name rate; do
          echo "$mode $c $p $run $name $rate" >>"$results"
        done <"$work/rates"
      done
      flush "${pair_ports[0]}"
      run_bench "$url" "BM_(${replays}IdemClaimComplete|StoreClaimComplete)/c:$c/" \
        "$c" 1 >"$work/rates"
      while read -r name rate; do
        echo "$mode $c 1 $run $name $rate" >>"$results"
      done <"$work/rates"
    done
    echo "one primary + replica, c=$c run $run:" "$(grep -E "^(plain|wait) $c [0-9]+ $run " \
      "$results" | awk '{printf "%s p=%s %s %d/s; ", $1, $3, $5, $6}')" >&2
  done
done
stop_group "$work/pair"
fi

# ---- 3. recovery -----------------------------------------------------------------------------
[[ $parts == *" 3 "* ]] || recovery_runs=0
for run in $(seq 1 "$recovery_runs"); do
  start_cluster "recover-cluster-$run"
  victim=${cluster_ports[0]}
  out=$("$bench" --mode=recover --url="$cluster_url" --primary-port="$victim" \
          --kill-pid="$(pid_in "$work/recover-cluster-$run/$victim/redis.pid")")
  echo "recovery cluster - $run - $out" >>"$results"
  echo "cluster recovery run $run: $out" >&2
  stop_group "$work/recover-cluster-$run"

  start_sentinels "recover-sentinel-$run"
  out=$("$bench" --mode=recover --url="$sentinel_url" \
          --kill-pid="$(pid_in "$work/recover-sentinel-$run/${pair_ports[0]}/redis.pid")")
  echo "recovery sentinel - $run - $out" >>"$results"
  echo "sentinel recovery run $run: $out" >&2
  stop_group "$work/recover-sentinel-$run"
done
echo "load average at end: $(load)" >&2

python3 - "$results" <<'PY'
import re, statistics, sys
rates, recovery = {}, {}
for line in open(sys.argv[1]):
    kind, c, p, run, name, value = line.split(maxsplit=5)
    if kind == "recovery":
        fields = dict(f.split("=") for f in value.split())
        recovery.setdefault(c, []).append(fields)
    else:
        rates.setdefault((kind, int(c), int(p), name), []).append(float(value))
med = {key: statistics.median(v) for key, v in rates.items()}
def k(x): return f"{x / 1000:,.1f}k/s"
def label(kind, c, p):
    return f"{kind} c={c}" + (f" P={p}" if kind == "marks" else "")
if med:
    print(f"medians of {len(next(iter(rates.values())))} runs")
cluster = sorted(key for key in med
                 if key[0] in ("marks", "replays") and key[3].startswith("BM_Idem"))
if cluster:
    print("1. three-primary cluster (3 primaries + 3 replicas + the client on this machine)")
    print(f"{'workload':<18} | {'idem':>10} {'redis-benchmark':>15} {'idem/rb':>7} | "
          f"{'raw per node':>12} {'idem/raw':>8} | {'idem per node':>13}")
    for kind, c, p, name in cluster:
        idem = med[(kind, c, p, name)]
        rb = med[(kind, c, p, "redis-benchmark")]
        raw = med[(kind, c, p, name.replace("Idem", "Raw"))]
        print(f"{label(kind, c, p):<18} | {k(idem):>10} {k(rb):>15} {idem / rb:>7.2f} | "
              f"{k(raw):>12} {idem / raw:>8.2f} | {k(idem / 3):>13}")
single = sorted((key for key in med
                 if key[0] == "plain" and key[3] in ("BM_IdemMarks", "BM_IdemReplays")),
                key=lambda key: (key[3], key[1], key[2]))
if single:
    print("2a. one node (a primary with its replica), min_replicas=0")
    print(f"{'workload':<18} | {'idem':>10} {'raw':>10} {'idem/raw':>8} | {'cluster/one node':>16}")
    for kind, c, p, name in single:
        idem = med[(kind, c, p, name)]
        raw = med[(kind, c, p, name.replace("Idem", "Raw"))]
        workload = "marks" if name == "BM_IdemMarks" else "replays"
        on_cluster = med.get((workload, c, p, name))
        versus = f"{on_cluster / idem:>16.2f}" if on_cluster else f"{'-':>16}"
        print(f"{label(workload, c, p):<18} | {k(idem):>10} {k(raw):>10} {idem / raw:>8.2f} | "
              f"{versus}")
waits = sorted((key for key in med if key[0] == "wait"), key=lambda key: (key[3], key[1], key[2]))
if waits:
    print("2b. the same node: min_replicas=1 (WAIT 1 500 after every write) / min_replicas=0")
    print(f"{'workload':<30} | {'none':>10} {'WAIT 1':>10} {'ratio':>6}")
    names = {"BM_IdemMarks": "marks", "BM_IdemClaimComplete": "recorder claim+complete",
             "BM_StoreClaimComplete": "store claim+complete"}
    for kind, c, p, name in waits:
        plain, wait = med[("plain", c, p, name)], med[(kind, c, p, name)]
        workload = f"{names[name]} c={c}" + (f" P={p}" if name == "BM_IdemMarks" else "")
        print(f"{workload:<30} | {k(plain):>10} {k(wait):>10} {wait / plain:>6.2f}")
if recovery:
    print("3. kill -9 of a primary: until the servers name the new primary / until idem's first "
          "successful mark on it")
    for group, runs in sorted(recovery.items()):
        done = [float(r["recovery_ms"]) for r in runs if r["recovery_ms"] != "none"]
        promoted = [float(r["promoted_ms"]) for r in runs if float(r["promoted_ms"]) >= 0]
        lost = len(runs) - len(done)
        def median(values): return statistics.median(values) if values else float("nan")
        print(f"{group:<9} promoted median {median(promoted):,.0f} ms, "
              f"first success median {median(done):,.0f} ms "
              f"(runs: {', '.join(r['promoted_ms'] + ' / ' + r['recovery_ms'] for r in runs)} ms; "
              f"failed calls before it: {', '.join(r['failed_calls'] for r in runs)})"
              f"{f'; {lost} runs never recovered' if lost else ''}")
PY
