#!/usr/bin/env bash
# `idem proxy` next to nginx proxying the same upstream with no idempotency, in the same run:
# throughput and latency (wrk) for new keys (every request forwarded, claimed and completed) and
# for repeated keys (every request a replay from the store, never reaching the upstream), on
# SQLite and on Redis. Targets: new keys >= 0.7x nginx's requests/s, replays >= 1.5x.
#
#   bench/http_proxy_bench.sh                                   # both upstreams, 3 runs of 10 s
#   UPSTREAMS=static RUNS=5 DURATION=20 CONNECTIONS=64 bench/http_proxy_bench.sh
#   THREADS=2 UPSTREAMS=static bench/http_proxy_bench.sh          # both proxies on two threads
#   REPLAY_CACHE=10000 bench/http_proxy_bench.sh    # idem proxies with --replay-cache 10000
#
# REPLAY_CACHE=N (default 0: off, as `idem proxy` is by default) gives the idem proxies an
# in-process replay cache of N entries (--replay-cache N, docs/http.md §4): a replay is then
# answered from the process for up to its max age (REPLAY_CACHE_MAX_AGE, default 1s) instead of
# from the store.
#
# Upstreams: `static` is nginx answering 201 with a small JSON body (the cheapest upstream there
# is: the proxies' own cost decides), `app` is tests/http/upstream.py (aiohttp, a Python API
# server: the upstream decides). Every proxy runs THREADS event-loop threads (default 1: nginx
# worker_processes THREADS, idem proxy --threads THREADS; the upstream keeps one), keeps upstream
# connections alive, and is driven by one wrk thread with CONNECTIONS connections. Each
# configuration runs RUNS times (>= 3), in a rotating order; the medians are compared. "Added" latency is the proxy's p50/p99 minus the upstream's own (wrk
# against it directly, same run). Build: IDEM_BUILD_DIR (default build/release, configured with
# the release preset when missing). Needs wrk and nginx (scripts/install-deps.sh bench).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

upstreams=${UPSTREAMS:-"static app"}
runs=${RUNS:-3}
duration=${DURATION:-10}
connections=${CONNECTIONS:-32}
threads=${THREADS:-1}
replay_cache=${REPLAY_CACHE:-0}
replay_cache_max_age=${REPLAY_CACHE_MAX_AGE:-1s}
build_dir=${IDEM_BUILD_DIR:-build/release}
idem=$build_dir/tools/idem/idem
[ "$runs" -ge 3 ] || { echo "RUNS must be >= 3 (medians)" >&2; exit 2; }
[ "$threads" -ge 1 ] || { echo "THREADS must be >= 1" >&2; exit 2; }
[ "$replay_cache" -ge 0 ] 2>/dev/null || { echo "REPLAY_CACHE must be >= 0" >&2; exit 2; }
proxy_flags=()
if [ "$replay_cache" -gt 0 ]; then
  proxy_flags=(--replay-cache "$replay_cache" --replay-cache-max-age "$replay_cache_max_age")
fi
need_tools http_proxy_bench "(scripts/install-deps.sh bench)" wrk nginx redis-server redis-cli \
  python3
build_missing "$idem" "$build_dir" idem 2
python=/usr/bin/python3  # Debian's, with python3-aiohttp

work=$(mktemp -d /tmp/idem-http-bench-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
wait_port() {
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "http_proxy_bench: nothing listens on port $1" >&2
  exit 1
}

# nginx with its own prefix: `start_nginx NAME SERVER_BLOCK [WORKERS]` writes $work/NAME/nginx.conf
# and runs it with WORKERS worker processes (default 1).
start_nginx() {
  local name=$1 server=$2 workers=${3:-1}
  mkdir -p "$work/$name/logs"
  cat >"$work/$name/nginx.conf" <<CONF
worker_processes $workers;
daemon off;
pid $work/$name/nginx.pid;
error_log $work/$name/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/$name/body;
  proxy_temp_path $work/$name/proxy;
  fastcgi_temp_path $work/$name/fastcgi;
  uwsgi_temp_path $work/$name/uwsgi;
  scgi_temp_path $work/$name/scgi;
  keepalive_requests 1000000;
  $server
}
CONF
  nginx -p "$work/$name" -c "$work/$name/nginx.conf" &
  pids+=($!)
}

redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work" --save "" --appendonly no \
  --daemonize no --logfile "$work/redis.log" &
pids+=($!)
wait_port "$redis_port"

# One wrk run: prints "requests/s p50_ms p99_ms".
measure() {
  local url=$1 script=$2 run_id=$3
  wrk -t1 -c"$connections" -d"${duration}s" --latency -s "$script" "$url" -- "$run_id" \
    >"$work/wrk.out" 2>&1 || { cat "$work/wrk.out" >&2; exit 1; }
  python3 - "$work/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def ms(value, unit):
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p50 = re.search(r"\s50%\s+([\d.]+)(us|ms|s)\b", text)
p99 = re.search(r"\s99%\s+([\d.]+)(us|ms|s)\b", text)
non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errors = re.search(r"Socket errors:.*", text)
if non2xx or errors:
    sys.stderr.write("http_proxy_bench: failed requests: %s\n" % (non2xx.group(0) if non2xx else errors.group(0)))
    sys.exit(1)
print(f"{rps:.1f} {ms(*p50.groups()):.3f} {ms(*p99.groups()):.3f}")
PY
}

results=$work/results.txt
: >"$results"
for upstream in $upstreams; do
  up_port=$(free_port)
  if [ "$upstream" = static ]; then
    start_nginx "upstream" "server { listen 127.0.0.1:$up_port; location / {
      default_type application/json; return 201 '{\"id\":\"pay_1\",\"status\":\"created\",\"amount\":500}'; } }"
  else
    mkdir -p "$work/app"
    $python tests/http/upstream.py --dir "$work/app" --port "$up_port" >/dev/null &
    pids+=($!)
  fi
  wait_port "$up_port"
  nginx_port=$(free_port)
  start_nginx "proxy-$upstream" "upstream app { server 127.0.0.1:$up_port; keepalive 64; }
    server { listen 127.0.0.1:$nginx_port; location / { proxy_pass http://app;
      proxy_http_version 1.1; proxy_set_header Connection \"\"; } }" "$threads"
  wait_port "$nginx_port"
  declare -A idem_port=()
  for store in sqlite redis; do
    port=$(free_port)
    if [ "$store" = sqlite ]; then
      url="sqlite://$work/proxy-$upstream.db"
    else
      url="redis://127.0.0.1:$redis_port/0?prefix=bench-$upstream:"
    fi
    "$idem" proxy --listen "127.0.0.1:$port" --upstream "127.0.0.1:$up_port" --store "$url" \
      --threads "$threads" ${proxy_flags[@]+"${proxy_flags[@]}"} \
      >"$work/idem-$store-$upstream.log" 2>&1 &
    pids+=($!)
    wait_port "$port"
    idem_port[$store]=$port
  done
  targets=("direct:$up_port" "nginx:$nginx_port" "idem-sqlite:${idem_port[sqlite]}"
           "idem-redis:${idem_port[redis]}")
  for run in $(seq 1 "$runs"); do
    # Rotate the order, so no configuration always runs first (or last) on a busy machine.
    for i in $(seq 0 $((${#targets[@]} - 1))); do
      target=${targets[$(( (i + run) % ${#targets[@]} ))]}
      name=${target%%:*}
      port=${target##*:}
      run_id="$upstream-$name-$run-$RANDOM"
      read -r rps p50 p99 < <(measure "http://127.0.0.1:$port/v1/payments" bench/http/unique_keys.lua "$run_id")
      echo "$upstream $name unique $run $rps $p50 $p99" >>"$results"
      echo "$upstream $name new keys, run $run: ${rps%.*} req/s, p50 $p50 ms, p99 $p99 ms" >&2
      if [ "$name" != direct ]; then
        # Warm up: the first request of each key runs; every one after replays.
        wrk -t1 -c8 -d1s -s bench/http/repeated_keys.lua "http://127.0.0.1:$port/v1/payments" \
          -- "$run_id" >/dev/null 2>&1
        read -r rps p50 p99 < <(measure "http://127.0.0.1:$port/v1/payments" bench/http/repeated_keys.lua "$run_id")
        echo "$upstream $name repeated $run $rps $p50 $p99" >>"$results"
        echo "$upstream $name repeated keys, run $run: ${rps%.*} req/s, p50 $p50 ms, p99 $p99 ms" >&2
      fi
    done
  done
done

PYTHONPATH=bench python3 - "$results" "$runs" "$duration" "$connections" \
  "$threads" \
  "$replay_cache" \
  "THREADS=$threads UPSTREAMS=\"$upstreams\" RUNS=$runs DURATION=$duration CONNECTIONS=$connections REPLAY_CACHE=$replay_cache bench/http_proxy_bench.sh" <<'PY'
import statistics, sys
from ratios import record
rows = {}
for line in open(sys.argv[1]):
    upstream, name, workload, run, rps, p50, p99 = line.split()
    rows.setdefault((upstream, name, workload), []).append((float(rps), float(p50), float(p99)))
runs, duration, connections, threads, replay_cache, command = sys.argv[2:8]
def med(key, i):
    return statistics.median(r[i] for r in rows[key])
ok = True
for upstream in dict.fromkeys(k[0] for k in rows):
    print(f"\nupstream: {upstream}  (wrk -t1 -c{connections} -d{duration}s, proxies on {threads} "
          f"thread(s), medians of {runs} runs)")
    print(f"{'proxy':<12} {'workload':<9} {'req/s':>9} {'vs nginx':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'added p50':>10} {'added p99':>10}")
    base50, base99 = med((upstream, "direct", "unique"), 1), med((upstream, "direct", "unique"), 2)
    for name in ("direct", "nginx", "idem-sqlite", "idem-redis"):
        for workload in ("unique", "repeated"):
            key = (upstream, name, workload)
            if key not in rows:
                continue
            rps, p50, p99 = med(key, 0), med(key, 1), med(key, 2)
            nginx = med((upstream, "nginx", workload), 0)
            ratio = rps / nginx if name.startswith("idem") else None
            label = "new keys" if workload == "unique" else "replays"
            added = "" if name == "direct" else f"{p50 - base50:>10.2f} {p99 - base99:>10.2f}"
            vs = "-" if ratio is None else f"{ratio:.2f}x"
            print(f"{name:<12} {label:<9} {rps:>9,.0f} {vs:>9} "
                  f"{p50:>8.2f} {p99:>8.2f} {added}")
            if ratio is not None:
                target = 0.7 if workload == "unique" else 1.5
                ok = ok and ratio >= target
                store = name.split("-")[1]
                on = "" if threads == "1" else f", {threads} threads"
                if replay_cache != "0":
                    on += f", replay cache {replay_cache}"
                record(f"idem proxy {label} / nginx ({store}, {upstream} upstream{on})", ratio, target,
                       f"idem {rps:.0f}/s, nginx {nginx:.0f}/s, medians of {runs} runs",
                       face="operation", group="idem proxy / nginx, same upstream",
                       bar=f"{label}, {store}, {upstream} upstream{on}", command=command)
print(f"\ntargets (new keys >= 0.7x nginx, replays >= 1.5x): {'met' if ok else 'NOT met'}")
PY
