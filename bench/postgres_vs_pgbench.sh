#!/usr/bin/env bash
# PostgreSQL recorder vs pgbench on the same statement at the same client count.
#
# pgbench runs a custom script with the recorder's INSERT ... ON CONFLICT DO NOTHING (prepared
# protocol, one connection per client, autocommit) against a throwaway server started by
# scripts/servers.sh; bench_postgres_recorder runs BM_RecorderMark with as many threads sharing one
# PostgresIdempotencyRecorder (pool_size >= clients). The runs alternate, each is repeated, and the
# medians and their ratio are printed (target: the recorder at >= 85% of pgbench's tps).
#
#   bench/postgres_vs_pgbench.sh                      # 8 clients, 3 runs of 5 s each
#   IDEM_BENCH_CLIENTS=4 IDEM_BENCH_RUNS=5 bench/postgres_vs_pgbench.sh
#   IDEM_BENCH_BUILD=build/h7-release bench/postgres_vs_pgbench.sh   # an existing build dir
set -euo pipefail
cd "$(dirname "$0")/.."

clients=${IDEM_BENCH_CLIENTS:-8}
runs=${IDEM_BENCH_RUNS:-3}
seconds=${IDEM_BENCH_SECONDS:-5}
build=${IDEM_BENCH_BUILD:-build/release}

if [ -z "${IDEM_TEST_POSTGRES_URL:-}" ]; then
  # Build outside the timed part, then rerun this script next to a fresh server.
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_TESTS=OFF \
      -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_TOOLS=OFF >/dev/null
  fi
  cmake --build "$build" -j "$(nproc)" --target bench_postgres_recorder >/dev/null
  exec scripts/servers.sh "$0" "$@"
fi
command -v pgbench >/dev/null || { echo "pgbench is not installed (apt-get install postgresql)" >&2; exit 1; }
bench_bin=$build/bench/bench_postgres_recorder
[ -x "$bench_bin" ] || { echo "missing $bench_bin" >&2; exit 1; }

url=$IDEM_TEST_POSTGRES_URL
schema=idem_bench
export IDEM_BENCH_POSTGRES_URL=$url IDEM_BENCH_POSTGRES_SCHEMA=$schema
work=$(mktemp -d /tmp/idem-pgbench-XXXXXX)
trap 'rm -rf "$work"' EXIT

# The same statement as PostgresIdempotencyRecorder::mark_processed: a new event id per
# transaction (two random numbers), the consumer, a timestamp.
cat > "$work/mark.sql" <<SQL
\set a random(1, 9000000000000000000)
\set b random(1, 9000000000000000000)
INSERT INTO ${schema}.processed_log (consumer, event_id, ts) VALUES ('pgbench', :a || '-' || :b, now()) ON CONFLICT (consumer, event_id) DO NOTHING;
SQL

# Creates the tables (and warms the server) before anything is timed.
"$bench_bin" --benchmark_filter="BM_RecorderMark/real_time/threads:1\$" --benchmark_min_time=0.2 \
  >/dev/null 2>&1

pgbench_tps() {
  pgbench -n -M prepared -c "$clients" -j "$clients" -T "$seconds" -f "$work/mark.sql" "$url" \
    2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1
}

idem_rate() {
  "$bench_bin" --benchmark_filter="BM_RecorderMark/real_time/threads:${clients}\$" \
    --benchmark_min_time="$seconds" --benchmark_format=json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["benchmarks"][0]["items_per_second"])'
}

pg=()
idem=()
for run in $(seq 1 "$runs"); do
  pg+=("$(pgbench_tps)")
  idem+=("$(idem_rate)")
  echo "run $run: pgbench ${pg[-1]} tps, idem recorder ${idem[-1]} marks/s" >&2
done

PYTHONPATH=bench python3 - "$clients" "${pg[*]}" "${idem[*]}" \
  "IDEM_BENCH_CLIENTS=$clients IDEM_BENCH_RUNS=$runs IDEM_BENCH_SECONDS=$seconds bench/postgres_vs_pgbench.sh" <<'PY'
import statistics, sys
from ratios import record
clients = sys.argv[1]
command = sys.argv[4]
pg = [float(x) for x in sys.argv[2].split()]
idem = [float(x) for x in sys.argv[3].split()]
pg_median, idem_median = statistics.median(pg), statistics.median(idem)
ratio = idem_median / pg_median
print(f"clients={clients} runs={len(pg)}")
print(f"pgbench INSERT ... ON CONFLICT DO NOTHING: median {pg_median:.0f} tps")
print(f"PostgresIdempotencyRecorder::mark_processed: median {idem_median:.0f} marks/s")
print(f"ratio {ratio:.1%} (target >= 85%): {'ok' if ratio >= 0.85 else 'BELOW TARGET'}")
record(f"PostgreSQL recorder marks / pgbench INSERT ON CONFLICT ({clients} client{'' if clients == '1' else 's'})", ratio, 0.85,
       f"idem {idem_median:.0f}/s, pgbench {pg_median:.0f} tps, medians of {len(pg)} runs",
       face="consumer", group="PostgreSQL recorder: marks / pgbench -M prepared, same INSERT",
       bar=f"{clients} client{'' if clients == '1' else 's'}", command=command)
PY
