#!/usr/bin/env bash
# The Redis recorder next to redis-benchmark, on the same private redis-server, with the same
# command, concurrency and pipelining; prints medians and the ratio (target: idem >= 80%).
#
#   bench/redis_vs_redis_benchmark.sh                        # C in "1 8 32", P in "1 16"
#   CLIENTS="8" PIPELINE="1 16" REQUESTS=200000 RUNS=5 bench/redis_vs_redis_benchmark.sh
#
# Workload: marking a fresh event processed. redis-benchmark sends
#   SET idem:m:{bench:00000000000000000000<12 random digits>} 1893456000000 NX
# (-r gives the random digits, so keys are new, shaped like idem's marker keys with a 32-character
# id), from C connections with P commands in flight per connection (-P). idem runs
# bench_redis_recorder: C threads, each with a pooled connection, calling mark_processed (P = 1)
# or mark_processed_batch with P ids (one pipelined round trip) — the same SET ... NX commands.
# bench_redis_recorder also reports a raw hiredis loop (C threads, same commands), which isolates
# idem's own cost from the difference between C blocking threads and redis-benchmark's single
# event loop.
#
# The server is started here on a free port (no persistence, like scripts/servers.sh) and
# flushed before every run. Each configuration runs RUNS times (>= 3) alternating the clients;
# the medians are compared. Build: IDEM_BUILD_DIR (default build/release, configured with the
# release preset when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

clients=${CLIENTS:-"1 8 32"}
pipelines=${PIPELINE:-"1 16"}
requests=${REQUESTS:-100000}
runs=${RUNS:-3}
build_dir=${IDEM_BUILD_DIR:-build/release}
bench=$build_dir/bench/bench_redis_recorder
[ "$runs" -ge 3 ] || { echo "RUNS must be >= 3 (medians)" >&2; exit 2; }

need_tools redis_vs_redis_benchmark "" redis-server redis-cli redis-benchmark python3
build_missing "$bench" "$build_dir" bench_redis_recorder "$(nproc)"

work=$(mktemp -d /tmp/idem-redis-bench-XXXXXX)
port=$(free_port)
cleanup() {
  redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
start_plain_redis "$work" "$port"
cli() { redis-cli -h 127.0.0.1 -p "$port" "$@" >/dev/null; }
url="redis://127.0.0.1:$port/0"

results=$work/results.txt
: >"$results"
for c in $clients; do
  for p in $pipelines; do
    for run in $(seq 1 "$runs"); do
      cli flushall
      rb=$(redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -n "$requests" -P "$p" -r 1000000000 \
             --csv SET 'idem:m:{bench:00000000000000000000__rand_int__}' 1893456000000 NX |
           tail -n 1 | cut -d, -f2 | tr -d '"')
      cli flushall
      "$bench" --url="$url" --clients="$c" --pipeline="$p" --requests="$requests" \
        --benchmark_format=json --benchmark_out="$work/idem.json" --benchmark_out_format=json \
        >/dev/null
      read -r idem raw < <(python3 - "$work/idem.json" <<'PY'
import json, sys
rates = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    rates[b["name"].split("/")[0]] = b["items_per_second"]
print(rates["BM_IdemRecorder"], rates["BM_RawHiredis"])
PY
)
      echo "$c $p $run $rb $idem $raw" >>"$results"
      echo "c=$c p=$p run $run: redis-benchmark ${rb%.*}/s  idem ${idem%.*}/s  raw hiredis ${raw%.*}/s" >&2
    done
  done
done

PYTHONPATH=bench python3 - "$results" "CLIENTS=\"$clients\" PIPELINE=\"$pipelines\" REQUESTS=$requests RUNS=$runs bench/redis_vs_redis_benchmark.sh" <<'PY'
import statistics, sys
from ratios import record
command = sys.argv[2]
rows = {}
for line in open(sys.argv[1]):
    c, p, run, rb, idem, raw = line.split()
    rows.setdefault((int(c), int(p)), []).append((float(rb), float(idem), float(raw)))
print(f"{'clients':>7} {'pipeline':>8} | {'redis-benchmark':>15} {'idem recorder':>14} "
      f"{'idem/rb':>8} | {'raw hiredis':>12} {'idem/raw':>8}")
worst = None
for (c, p), runs in sorted(rows.items()):
    rb = statistics.median(r[0] for r in runs)
    idem = statistics.median(r[1] for r in runs)
    raw = statistics.median(r[2] for r in runs)
    ratio = idem / rb
    worst = ratio if worst is None else min(worst, ratio)
    print(f"{c:>7} {p:>8} | {rb:>13,.0f}/s {idem:>12,.0f}/s {ratio:>7.0%} | "
          f"{raw:>10,.0f}/s {idem / raw:>7.0%}")
    record(f"Redis recorder SET NX / redis-benchmark (c={c}, P={p})", ratio, 0.80,
           f"idem {idem:.0f}/s, redis-benchmark {rb:.0f}/s, medians of {len(runs)} runs",
           face="consumer", group="Redis recorder: SET NX / redis-benchmark, same command",
           bar=f"{c} client{'' if c == 1 else 's'}, pipeline {p}", command=command)
print(f"medians of {len(next(iter(rows.values())))} runs; target idem/redis-benchmark >= 80%: "
      f"{'met' if worst >= 0.8 else 'NOT met'} (lowest {worst:.0%})")
PY
