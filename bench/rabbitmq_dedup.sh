#!/usr/bin/env bash
# End-to-end events/s through RabbitMQ with dedup on SQLite, Redis and PostgreSQL, against the same
# pipeline without dedup in the same run (target: dedup overhead <= 15%, ratio >= 0.85).
#
#   bench/rabbitmq_dedup.sh                  # EVENTS=5000 RUNS=3 PREFETCH=64 OVERLAP=1
#   EVENTS=10000 RUNS=5 PREFETCH=256 bench/rabbitmq_dedup.sh
#   OVERLAP=0 bench/rabbitmq_dedup.sh         # ConsumerOptions::pipeline = false everywhere
#   STORE_RTT_US=500 bench/rabbitmq_dedup.sh  # every recorder call waits 0.5 ms first (a store
#                                             # on another machine, simulated)
#   MODE=flow bench/rabbitmq_dedup.sh         # publish and consume at once; time the stream
#                                             # end to end (default drain: consume a backlog)
#
# Each run does every pipeline once, in alternating order (run 1: plain first, run 2: plain last),
# each on a fresh queue: publish EVENTS with publish_batch, consume them with one Consumer
# (prefetch and batch_size PREFETCH, default 64: the consumer hands up to that many deliveries
# that have already arrived to the handler at once). Pipelines: plain (no recorder), sqlite-normal / sqlite-full (file recorder,
# synchronous=NORMAL / FULL), redis, postgres — IdempotentHandler in check_then_mark mode.
# Prints the medians of the consume phase (and of the publish phase) and the ratios
# dedup events/s / plain events/s, and records them with bench/ratios.py.
# Servers: reuses IDEM_TEST_AMQP_URL / _REDIS_URL / _POSTGRES_URL when all are set, otherwise
# reruns itself under scripts/servers.sh. Build: IDEM_BENCH_BUILD (default build/release).
set -euo pipefail
cd "$(dirname "$0")/.."

events=${EVENTS:-5000}
runs=${RUNS:-3}
prefetch=${PREFETCH:-64}
overlap=${OVERLAP:-1}
rtt_us=${STORE_RTT_US:-0}
mode=${MODE:-drain}
build=${IDEM_BENCH_BUILD:-build/release}
[ "$runs" -ge 3 ] || { echo "RUNS must be >= 3 (medians)" >&2; exit 2; }

if [ -z "${IDEM_TEST_AMQP_URL:-}" ] || [ -z "${IDEM_TEST_REDIS_URL:-}" ] ||
   [ -z "${IDEM_TEST_POSTGRES_URL:-}" ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_TESTS=OFF \
      -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_TOOLS=OFF >/dev/null
  fi
  cmake --build "$build" -j 2 --target bench_rabbitmq_pipeline >/dev/null
  exec scripts/servers.sh "$0" "$@"
fi
bench_bin=$build/bench/bench_rabbitmq_pipeline
[ -x "$bench_bin" ] || { echo "missing $bench_bin" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results.txt
pipelines=(plain sqlite-normal sqlite-full redis postgres)

recorder_url() {  # $1 pipeline, $2 run
  case $1 in
    plain) echo none ;;
    sqlite-normal) echo "sqlite://$work/normal-$2.db?durability=normal" ;;
    sqlite-full) echo "sqlite://$work/full-$2.db?durability=full" ;;
    redis) echo "$IDEM_TEST_REDIS_URL" ;;
    postgres) echo "$IDEM_TEST_POSTGRES_URL" ;;
  esac
}

for run in $(seq 1 "$runs"); do
  order=("${pipelines[@]}")
  if [ $((run % 2)) -eq 0 ]; then  # alternate: plain last on even runs
    order=(sqlite-normal sqlite-full redis postgres plain)
  fi
  for p in "${order[@]}"; do
    line=$("$bench_bin" "$IDEM_TEST_AMQP_URL" "$p" "$(recorder_url "$p" "$run")" "$events" "$prefetch" "$overlap" "$rtt_us" "$mode")
    echo "run $run: $line"
    echo "$line" >>"$results"
  done
done

command="EVENTS=$events RUNS=$runs PREFETCH=$prefetch"
[ "$overlap" = 1 ] || command+=" OVERLAP=$overlap"
[ "$rtt_us" = 0 ] || command+=" STORE_RTT_US=$rtt_us"
[ "$mode" = drain ] || command+=" MODE=$mode"
PYTHONPATH=bench python3 - "$results" "$events" "$runs" "$prefetch" "$overlap" "$rtt_us" "$mode" \
  "$command bench/rabbitmq_dedup.sh" <<'PY'
import statistics, sys
from ratios import record
path, events, runs, prefetch, overlap, rtt_us, mode, command = sys.argv[1:9]
titles = {"sqlite-normal": "SQLite (normal)", "sqlite-full": "SQLite (full)", "redis": "Redis",
          "postgres": "PostgreSQL"}
by = {}
for line in open(path):
    fields = dict(f.split("=") for f in line.split())
    by.setdefault(fields["pipeline"], []).append(fields)
med = {p: (statistics.median(float(r["publish_eps"]) for r in rs),
           statistics.median(float(r["consume_eps"]) for r in rs)) for p, rs in by.items()}
plain = med["plain"][1]
print(f"\nmedians of {runs} runs, {events} events each, prefetch {prefetch}, "
      f"pipeline {'on' if overlap == '1' else 'off'}, simulated store round trip {rtt_us} us, "
      f"mode {mode} (events/s)")
what = "consume" if mode == "drain" else "stream"
print(f"{'pipeline':>14} {'publish':>9} {what:>9} {'ratio':>6} {'overhead':>8}")
for p, (pub, con) in med.items():
    ratio = con / plain
    print(f"{p:>14} {pub:9.0f} {con:9.0f} {ratio:6.2f} {1 - ratio:8.1%}")
    if p != "plain":
        variant = ("" if overlap == "1" else " no pipeline") + \
            ("" if rtt_us == "0" else f" rtt {rtt_us}us") + ("" if mode == "drain" else f" {mode}")
        record(f"rabbitmq dedup {p} prefetch {prefetch}{variant}", ratio, 0.85,
               f"{what} {con:.0f} vs plain {plain:.0f} events/s, {events} events, "
               f"median of {runs}, prefetch {prefetch}, pipeline {overlap}, "
               f"store rtt {rtt_us} us, mode {mode}, check_then_mark", face="consumer",
               group="RabbitMQ consumer with dedup (check_then_mark) / the same pipeline without",
               bar=f"{titles.get(p, p)}, {'live stream' if mode == 'flow' else 'drain'}, "
                   f"prefetch {prefetch}{variant.replace(' flow', '')}",
               command=command)
PY
