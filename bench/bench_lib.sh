# Shell helpers shared by the bench/*.sh scripts, which source this file from the repository root
# (after their `cd "$(dirname "$0")/.."`).

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

# free_port [N]: N (default 1) free TCP ports on 127.0.0.1, one a line.
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
# its files in DIR; waits up to 10 s for it to answer PING.
start_plain_redis() {
  local dir=$1 port=$2
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save "" --appendonly no \
    --daemonize yes --logfile "$dir/redis.log" --pidfile "$dir/redis.pid" >/dev/null
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
}
