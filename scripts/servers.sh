#!/usr/bin/env bash
# Starts the servers idem's tests use — redis-server, PostgreSQL and RabbitMQ — on 127.0.0.1 with
# free ports and temp data dirs, runs a command with their URLs in the environment, and stops them
# afterwards (also when the command fails or is interrupted).
#
#   scripts/servers.sh ctest --preset default
#
# Exports IDEM_TEST_REDIS_URL (redis://127.0.0.1:PORT/0) and IDEM_TEST_POSTGRES_URL
# (postgresql://idem@127.0.0.1:PORT/idem_test) plus IDEM_TEST_SERVERS_DIR (logs, data) and
# IDEM_TEST_REDIS_CLI / IDEM_TEST_PG_CTL_CMD for tests that stop and restart a server, and
# IDEM_TEST_AMQP_URL (amqp://guest:guest@127.0.0.1:PORT/) with IDEM_TEST_RABBITMQCTL (a command
# line: append e.g. `stop_app` / `start_app` to restart the broker under a test).
# A server whose binaries are missing is an error: CI must not silently skip its tests.
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: scripts/servers.sh COMMAND [ARGS...]" >&2; exit 2; }

work=$(mktemp -d /tmp/idem-servers-XXXXXX)
chmod 755 "$work"
export IDEM_TEST_SERVERS_DIR=$work
pids=()

free_port() {
  python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
pg_user=postgres
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$pg_user" -- "$@"; else "$@"; fi
}

cleanup() {
  set +e
  if [ -n "${redis_port:-}" ]; then
    redis-cli -h 127.0.0.1 -p "$redis_port" shutdown nosave >/dev/null 2>&1
  fi
  if [ -n "${pg_data:-}" ] && [ -d "$pg_data" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -m immediate stop >/dev/null 2>&1
  fi
  if [ -n "${IDEM_TEST_RABBITMQCTL:-}" ]; then
    $IDEM_TEST_RABBITMQCTL stop >/dev/null 2>&1
    [ "${epmd_was_running:-1}" = 0 ] && pkill -x epmd
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# ---- RabbitMQ (started first: the Erlang VM takes several seconds to boot, so it comes up while
# the other two are being set up) ---------------------------------------------------------------
rmq_bin=/usr/lib/rabbitmq/bin
[ -x "$rmq_bin/rabbitmq-server" ] || { echo "servers.sh: rabbitmq-server is not installed" >&2; exit 1; }
amqp_port=$(free_port)
rmq_dist_port=$(free_port)
rmq_node=idem_$amqp_port@localhost
mkdir -p "$work/rabbitmq"
cat >"$work/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$amqp_port
loopback_users = none
log.console = false
log.file.level = warning
EOF
echo '[].' >"$work/rabbitmq/enabled_plugins"
pgrep -x epmd >/dev/null && epmd_was_running=1 || epmd_was_running=0
# HOME holds the Erlang cookie shared by the server and rabbitmqctl.
rmq_env=(env HOME="$work/rabbitmq" RABBITMQ_NODENAME="$rmq_node" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  RABBITMQ_NODE_PORT="$amqp_port" RABBITMQ_DIST_PORT="$rmq_dist_port" ERL_EPMD_ADDRESS=127.0.0.1
  RABBITMQ_MNESIA_BASE="$work/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$work/rabbitmq/log"
  RABBITMQ_CONFIG_FILE="$work/rabbitmq/rabbitmq" RABBITMQ_PID_FILE="$work/rabbitmq/rabbit.pid"
  RABBITMQ_ENABLED_PLUGINS_FILE="$work/rabbitmq/enabled_plugins")
"${rmq_env[@]}" "$rmq_bin/rabbitmq-server" >"$work/rabbitmq/server.out" 2>&1 &
pids+=($!)
export IDEM_TEST_RABBITMQCTL="env HOME=$work/rabbitmq $rmq_bin/rabbitmqctl -n $rmq_node"

# ---- Redis -----------------------------------------------------------------------------------
command -v redis-server >/dev/null || { echo "servers.sh: redis-server is not installed" >&2; exit 1; }
redis_port=$(free_port)
mkdir -p "$work/redis"
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" --save "" \
  --appendonly no --daemonize yes --logfile "$work/redis/redis.log" \
  --pidfile "$work/redis/redis.pid" >/dev/null
for _ in $(seq 1 100); do
  redis-cli -h 127.0.0.1 -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -h 127.0.0.1 -p "$redis_port" ping >/dev/null || { cat "$work/redis/redis.log" >&2; exit 1; }
export IDEM_TEST_REDIS_URL="redis://127.0.0.1:${redis_port}/0"
export IDEM_TEST_REDIS_PORT=$redis_port

# ---- PostgreSQL ------------------------------------------------------------------------------
[ -x "$pg_bin/initdb" ] || { echo "servers.sh: PostgreSQL server binaries not found" >&2; exit 1; }
pg_port=$(free_port)
pg_data=$work/pg/data
mkdir -p "$work/pg"
if [ "$(id -u)" -eq 0 ]; then chown -R "$pg_user" "$work/pg"; fi
as_pg "$pg_bin/initdb" -D "$pg_data" -U idem --auth=trust -E UTF8 --no-sync >/dev/null
as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$work/pg/postgres.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $work/pg -c fsync=off -c max_connections=200" \
  start >/dev/null
as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U idem idem_test
export IDEM_TEST_POSTGRES_URL="postgresql://idem@127.0.0.1:${pg_port}/idem_test"
export IDEM_TEST_POSTGRES_PORT=$pg_port
export IDEM_TEST_PG_CTL_CMD="$pg_bin/pg_ctl -D $pg_data"

if ! $IDEM_TEST_RABBITMQCTL wait "$work/rabbitmq/rabbit.pid" --timeout 120 >/dev/null 2>&1; then
  echo "servers.sh: rabbitmq-server did not start" >&2
  cat "$work/rabbitmq/server.out" "$work/rabbitmq/log/"*.log >&2 2>/dev/null
  exit 1
fi
export IDEM_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:${amqp_port}/"
export IDEM_TEST_AMQP_PORT=$amqp_port

echo "servers.sh: redis on $redis_port, postgresql on $pg_port, rabbitmq on $amqp_port (dir $work)" >&2
set +e
"$@"
status=$?
exit $status
