#!/usr/bin/env bash
# idem's Redis store next to the Node libraries that do its job, on the same private redis-server,
# in the same run: calls/s, client CPU µs per call and Redis server CPU µs per call, for new keys
# (claim, run a trivial function, store its result) and replays (keys completed beforehand, each
# call returns the stored result).
#
#   bench/redis_peers.sh                                # 3 rounds of 20000 calls per measurement
#   RUNS=5 CALLS=50000 bench/redis_peers.sh
#
# The clients, each with 50 calls in flight unless said otherwise:
#   idem-async         AsyncRedisStore, 50 coroutines on one pipelined connection
#   idem-blocking      RedisIdempotencyStore, 50 threads over its pool (8 connections)
#   idem-async-seq     the same with one call in flight (one coroutine)
#   idem-blocking-seq  the same with one call in flight (one thread)
#   powertools         @aws-lambda-powertools/idempotency 2.35.0, CachePersistenceLayer over
#                      @redis/client 6.4.0, one connection (bench/peers/powertools.mjs)
#   node-idempotency   @node-idempotency/core 1.0.11 with @node-idempotency/storage-adapter-redis
#                      1.0.2 over redis 4.7.1 (@redis/client 1.6.1), one connection
#                      (bench/peers/node_idempotency.mjs)
#   redis-benchmark    one connection, 50 pipelined (-c 1 -P 50): SET of a random key NX (new),
#                      GET of one stored key (replay): the server's floor for one command per call
#   raw                hiredis, one connection, idem's very commands 50 at a time: the floor for
#                      idem's commands (bench_redis_async --mode=raw)
# The versions are pinned in bench/peers/package.json and package-lock.json (npm ci installs
# them). Server CPU is INFO cpu (user + system) read before and after the timed loop only; the
# peers also print their commands per call (INFO commandstats). Each round runs every client on
# both workloads in a rotating order, the server flushed before each measurement; each line printed
# carries the 1-minute load average at its end. Then the medians, the ratios idem-async /
# Powertools and / node-idempotency, async / blocking (50 and 1 in flight), and the Redis CPU per
# new key of idem-async / node-idempotency. Finally a joiners check: 50 concurrent calls of ONE key
# whose function takes 100 ms, counting the peers' executions and rejected calls (the peers reject
# a duplicate in progress; idem's callers join the one execution, as its tests assert:
# IdemAsyncStoreConformance.ResilientCallersJoinOneExecutionAndReplay on Redis,
# unit/async_join_test).
#
# Raw results: bench/results/redis_peers.json. With RUNS >= 3 the idem / peer ratios are recorded
# in bench/results/ratios.json (bench/ratios.py). Build: IDEM_BUILD_DIR (default build/release,
# configured with the release preset when missing). Needs node >= 20 and npm
# (scripts/install-deps.sh bench), redis-server, redis-cli and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

runs=${RUNS:-3}
calls=${CALLS:-20000}
build_dir=${IDEM_BUILD_DIR:-build/release}
bench=$build_dir/bench/bench_redis_async
[ "$runs" -ge 1 ] || { echo "redis_peers: RUNS must be >= 1" >&2; exit 2; }
[ "$runs" -ge 3 ] || echo "redis_peers: RUNS=$runs < 3: medians of too few runs, ratios not recorded" >&2

need_tools redis_peers "(scripts/install-deps.sh test bench)" node npm redis-server redis-cli \
  redis-benchmark python3
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
  { echo "redis_peers: node >= 20 needed (the peers' @redis/client 6), found $(node --version)" >&2; exit 1; }
build_missing "$bench" "$build_dir" bench_redis_async 2
# The peers' exact tree, from the committed lockfile; again only when the lockfile changed.
if [ ! -f bench/peers/node_modules/.package-lock.json ] ||
   [ bench/peers/package-lock.json -nt bench/peers/node_modules/.package-lock.json ]; then
  (cd bench/peers && npm ci --no-audit --no-fund >&2)
fi

work=$(mktemp -d /tmp/idem-redis-peers-XXXXXX)
port=$(free_port)
cleanup() {
  redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start_plain_redis "$work" "$port"
url="redis://127.0.0.1:$port/0"

# redis-benchmark as one JSON line like the others: its calls/s, its CPU (this helper's waited
# children) and the server's (INFO cpu), both around its run only.
redis_benchmark() {
  python3 - "$port" "$calls" "$1" <<'PY'
import json, resource, subprocess, sys
port, calls, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cli = ["redis-cli", "-h", "127.0.0.1", "-p", port]
def server_cpu():
    info = subprocess.run(cli + ["info", "cpu"], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])
if workload == "new":
    command = ["SET", "idem-bench:{__rand_int__}", "result", "NX"]
else:
    subprocess.run(cli + ["set", "idem-bench:replay", "result"], capture_output=True, check=True)
    command = ["GET", "idem-bench:replay"]
server_before = server_cpu()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", port, "-c", "1", "-P", "50",
                      "-n", str(calls), "-r", "1000000000", "--csv"] + command,
                     capture_output=True, text=True, check=True).stdout
after = resource.getrusage(resource.RUSAGE_CHILDREN)
server = server_cpu() - server_before
rate = float(out.strip().splitlines()[-1].split(",")[1].strip('"'))
client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
print(json.dumps({"library": "redis-benchmark", "workload": workload, "calls": calls,
                  "in_flight": 50, "calls_per_s": rate, "client_cpu_us_per_call": client * 1e6 / calls,
                  "server_cpu_us_per_call": server * 1e6 / calls}))
PY
}

measure() {
  local client=$1 workload=$2
  case "$client" in
    idem-*) "$bench" --url="$url" --mode="${client#idem-}" --workload="$workload" --calls="$calls" ;;
    raw) "$bench" --url="$url" --mode=raw --workload="$workload" --calls="$calls" ;;
    powertools) node bench/peers/powertools.mjs "$url" "$workload" "$calls" ;;
    node-idempotency) node bench/peers/node_idempotency.mjs "$url" "$workload" "$calls" ;;
    redis-benchmark) redis_benchmark "$workload" ;;
  esac
}

clients=(idem-async idem-blocking idem-async-seq idem-blocking-seq powertools node-idempotency
         redis-benchmark raw)
results=$work/results.jsonl
: >"$results"
for run in $(seq 1 "$runs"); do
  # Rotate the order, so no client always runs first (or last) on a busy machine.
  for i in $(seq 0 $((${#clients[@]} - 1))); do
    client=${clients[$(( (i + run - 1) % ${#clients[@]} ))]}
    for workload in new replay; do
      redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
      line=$(measure "$client" "$workload" | tail -n 1)
      load=$(cut -d' ' -f1 /proc/loadavg)
      python3 - "$line" "$client" "$run" "$load" >>"$results" <<'PY'
import json, sys
m = json.loads(sys.argv[1])
m.update(client=sys.argv[2], run=int(sys.argv[3]), load1=float(sys.argv[4]))
print(json.dumps(m))
sys.stderr.write(f"run {m['run']} {m['client']:<17} {m['workload']:<6} {m['calls_per_s']:>9,.0f} calls/s"
                 f"  client {m['client_cpu_us_per_call']:6.1f} µs/call"
                 f"  server {m['server_cpu_us_per_call']:6.1f} µs/call  load {m['load1']:.2f}\n")
PY
    done
  done
done
for peer in powertools node-idempotency; do
  redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
  measure "$peer" joiners | tail -n 1 >>"$results"
done

mkdir -p bench/results
PYTHONPATH=bench python3 - "$results" "$runs" "$calls" "RUNS=$runs CALLS=$calls bench/redis_peers.sh" <<'PY'
import json, statistics, sys
from ratios import record
lines = [json.loads(line) for line in open(sys.argv[1])]
runs, calls, command = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open("bench/results/redis_peers.json", "w") as f:
    json.dump({"command": command, "results": lines}, f, indent=1)
    f.write("\n")
rows = {}
for m in lines:
    if m["workload"] != "joiners":
        rows.setdefault((m["client"], m["workload"]), []).append(m)
def med(client, workload, field):
    return statistics.median(m[field] for m in rows[(client, workload)])
print(f"\n{calls} calls per measurement, medians of {runs} run{'s' if runs > 1 else ''}")
print(f"{'client':<18} {'workload':<8} {'calls/s':>10} {'client µs/call':>15} {'server µs/call':>15}")
clients = dict.fromkeys(m["client"] for m in lines if m["workload"] != "joiners")
for workload in ("new", "replay"):
    for client in clients:
        print(f"{client:<18} {workload:<8} {med(client, workload, 'calls_per_s'):>10,.0f} "
              f"{med(client, workload, 'client_cpu_us_per_call'):>15.1f} "
              f"{med(client, workload, 'server_cpu_us_per_call'):>15.1f}")
print("\nratios of the medians (calls/s)")
print(f"{'':<38} {'new':>7} {'replay':>7}")
ratio = lambda a, b, w: med(a, w, "calls_per_s") / med(b, w, "calls_per_s")
for label, a, b in (("idem-async / powertools", "idem-async", "powertools"),
                    ("idem-async / node-idempotency", "idem-async", "node-idempotency"),
                    ("async / blocking (50 in flight)", "idem-async", "idem-blocking"),
                    ("async / blocking (1 in flight)", "idem-async-seq", "idem-blocking-seq"),
                    ("idem-async / raw hiredis", "idem-async", "raw")):
    print(f"{label:<38} {ratio(a, b, 'new'):>6.2f}x {ratio(a, b, 'replay'):>6.2f}x")
cpu = (med("idem-async", "new", "server_cpu_us_per_call") /
       med("node-idempotency", "new", "server_cpu_us_per_call"))
print(f"Redis CPU per new key, idem-async / node-idempotency: {cpu:.2f}x")
print("\njoiners: 50 concurrent calls of one key")
for m in lines:
    if m["workload"] == "joiners":
        print(f"{m['library']:<18} {m['executions']} execution(s), {m['rejected']} rejected, "
              f"{m['returned']} returned a result")
print("idem               1 execution, every call gets its result: the joiners wait for it "
      "(test IdemAsyncStoreConformance.ResilientCallersJoinOneExecutionAndReplay, on Redis in "
      "conformance/redis_async_store_conformance_test)")
if runs >= 3:
    # The targets BENCHMARKS.md states for the async face next to the peers.
    targets = {("powertools", "new"): 2.0, ("powertools", "replay"): 2.5,
               ("node-idempotency", "new"): 1.5, ("node-idempotency", "replay"): 1.5}
    for peer, name in (("powertools", "Powertools"), ("node-idempotency", "node-idempotency")):
        for workload, label in (("new", "new keys"), ("replay", "replays")):
            r = ratio("idem-async", peer, workload)
            record(f"Redis store {label} / {name} (50 in flight, one connection)", r,
                   targets[(peer, workload)],
                   f"idem {med('idem-async', workload, 'calls_per_s'):.0f}/s, {name} "
                   f"{med(peer, workload, 'calls_per_s'):.0f}/s, medians of {runs} runs",
                   face="operation", group="Redis store: idem / Node peers, same server",
                   bar=f"{label}, / {name}", command=command)
    for workload, label in (("new", "new keys"), ("replay", "replays")):
        record(f"Redis store {label}, async / blocking, 1 call in flight",
               ratio("idem-async-seq", "idem-blocking-seq", workload), 1.0,
               f"async {med('idem-async-seq', workload, 'calls_per_s'):.0f}/s, blocking "
               f"{med('idem-blocking-seq', workload, 'calls_per_s'):.0f}/s, medians of {runs} runs",
               face="operation", group="Redis store: idem / Node peers, same server",
               bar=f"{label}, async / blocking, sequential", command=command)
PY
