# Shell helpers shared by scripts/servers.sh, scripts/failover-soak.sh and the bench/*.sh
# scripts, which source this file (`. scripts/lib.sh` from the repository root).

# need_tools NAME HINT TOOL...: exits 1 with "NAME: TOOL not found HINT" (HINT may be empty) for
# the first TOOL that is not on PATH.
need_tools() {
  local name=$1 hint=$2 tool
  shift 2
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$name: $tool not found${hint:+ $hint}" >&2; exit 1; }
  done
}

# build_missing PROGRAM BUILD_DIR TARGET JOBS: unless PROGRAM is an executable, builds TARGET in
# BUILD_DIR with JOBS jobs (build/release is configured with the release preset when missing;
# an existing tree is configured again, so that it knows a target added since).
build_missing() {
  local program=$1 build_dir=$2 target=$3 jobs=$4
  [ -x "$program" ] && return 0
  if [ "$build_dir" = build/release ] && [ ! -d build/release ]; then
    cmake --preset release >/dev/null
  fi
  cmake "$build_dir" >/dev/null
  cmake --build "$build_dir" -j "$jobs" --target "$target" >/dev/null
}

# free_port [N]: N (default 1) distinct free ports on 127.0.0.1, one a line (each socket stays
# bound until all are chosen, so one call never names a port twice).
free_port() {
  python3 - "${1:-1}" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}

# start_plain_redis DIR PORT: a daemonized redis-server on 127.0.0.1:PORT without persistence,
# its files in DIR; fails unless it answers PING within 30 s.
start_plain_redis() {
  local dir=$1 port=$2
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save "" --appendonly no \
    --daemonize yes --logfile "$dir/redis.log" --pidfile "$dir/redis.pid" >/dev/null
  within_30s redis_answers "$port" || {
    echo "redis-server on port $port did not answer PING in 30 s (see $dir/redis.log)" >&2
    return 1
  }
}
redis_answers() { redis-cli -h 127.0.0.1 -p "$1" ping >/dev/null 2>&1; }

# Stopping touches only what this run started, found by its own PID (never by a process name:
# several runs, or a user's own servers, may be up beside this one).
# stop_pid PID: SIGTERM, then up to 30 s for the process to go, then SIGKILL.
stop_pid() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
}
# The PID a server wrote into PIDFILE (its first line), "" when there is none.
pid_in() { [ -f "$1" ] && head -n 1 "$1" | tr -dc 0-9 || true; }

# within_30s CHECK...: runs CHECK every 0.1 s until it succeeds; fails after 30 s.
within_30s() {
  local _
  for _ in $(seq 1 300); do
    "$@" && return 0
    sleep 0.1
  done
  "$@"
}
