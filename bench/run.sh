#!/usr/bin/env bash
# Runs idem's benchmarks (Release build) with repetitions and prints medians and the ratios
# against the baselines measured in the same run. Writes bench/results/<name>.json. The
# repetitions of idem and of its baseline are interleaved at random, so a slow spell of the
# machine (a disk's fsync latency, another process) falls on both rather than on one.
#
#   bench/run.sh                 # everything
#   bench/run.sh sqlite_recorder # one benchmark binary
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
cmake --preset release >/dev/null
mkdir -p bench/results
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(memory_recorder sqlite_recorder operations)
fi
for name in "${names[@]}"; do
  cmake --build --preset release -j "$(nproc)" --target "bench_${name}" >/dev/null
  echo "== bench_${name}" >&2
  "build/release/bench/bench_${name}" --benchmark_repetitions="${IDEM_BENCH_REPETITIONS:-5}" \
    --benchmark_min_time="${IDEM_BENCH_MIN_TIME:-0.5}" \
    --benchmark_enable_random_interleaving=true \
    --benchmark_display_aggregates_only=true --benchmark_out_format=json \
    --benchmark_out="bench/results/${name}.json" >/dev/null
done
python3 bench/report.py "${names[@]/#/bench/results/}"
