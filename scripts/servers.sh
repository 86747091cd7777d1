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
# Runs may overlap (several test commands, a demo beside a test run): each has its own ports,
# directories and Erlang port mapper, and stops only the processes it started, by their PIDs.
#
# TLS (a throwaway CA and certificates made by openssl in IDEM_TEST_TLS_DIR; EC P-256 keys, the
# server certificate names DNS:localhost only, so connecting to 127.0.0.1 is a hostname mismatch):
#   IDEM_TEST_TLS_DIR            ca.crt (the CA), server.crt/server.key (CN/SAN localhost),
#                                server-expired.crt (same key, expired yesterday),
#                                client.crt/client.key (CN idem_mtls, clientAuth),
#                                other-ca.crt (a CA that signed nothing the servers present),
#                                rogue-client.crt/rogue-client.key (a client cert by other-ca)
#   IDEM_TEST_POSTGRES_TLS_URL   postgresql://idem_tls@localhost:PORT/idem_test?sslmode=verify-full
#                                &sslrootcert=...: a second PostgreSQL whose every pg_hba rule is
#                                hostssl. Roles: idem (superuser, trust; for test set-up only),
#                                idem_tls (scram-sha-256, password in IDEM_TEST_POSTGRES_TLS_PASSWORD
#                                and in the file IDEM_TEST_TLS_DIR/pg-password), idem_mtls
#                                (scram-sha-256 plus clientcert=verify-full: needs client.crt),
#                                idem_plain (scram-sha-256 without TLS, the one plaintext rule:
#                                bench/postgres_tls_bench.cpp's baseline on the same server).
#   IDEM_TEST_POSTGRES_TLS_PORT, IDEM_TEST_POSTGRES_TLS_ADMIN_URL (a libpq string: the idem
#                                superuser over the unix socket, which works whatever certificate
#                                the server presents; for test set-up only)
#   IDEM_TEST_AMQPS_URL          amqps://guest:guest@localhost:PORT/?cacertfile=...&certfile=...
#                                &keyfile=...: the broker's TLS listener (verify_peer and
#                                fail_if_no_peer_cert, so every amqps client shows client.crt);
#                                IDEM_TEST_AMQPS_PORT
#   IDEM_TEST_REDIS_TLS_PORT     redis-server's --tls-port on the same instance as
#                                IDEM_TEST_REDIS_PORT, --tls-auth-clients yes (client.crt needed)
#   IDEM_TEST_REDIS_TLS_EXPIRED_PORT  a second, TLS-only redis-server presenting
#                                server-expired.crt, --tls-auth-clients no (for the refusal of an
#                                expired certificate without disturbing the shared instance)
#
# A streaming standby of the test PostgreSQL, on request only (the default run does not pay for
# it): IDEM_TEST_POSTGRES_STANDBY=1 starts a second PostgreSQL from `pg_basebackup -R` of the
# primary (replication slot idem_standby, hot_standby=on, its own data dir and free port);
# IDEM_TEST_POSTGRES_SYNC=1 as well makes it the synchronous standby
# (synchronous_standby_names = '*' on the primary, so each COMMIT waits for it). Exports
#   IDEM_TEST_POSTGRES_STANDBY_URL   postgresql://idem@127.0.0.1:PORT/idem_test (read-only)
#   IDEM_TEST_POSTGRES_STANDBY_PORT
#   IDEM_TEST_POSTGRES_FAILOVER_URL  postgresql://idem@127.0.0.1:P1,127.0.0.1:P2/idem_test
#                                    ?target_session_attrs=read-write (libpq takes the first
#                                    host that accepts writes)
#   IDEM_TEST_PG_STANDBY_CTL_CMD     "<bin>/pg_ctl -D <standby data>" (append `promote`)
# Tests that kill the primary use a pair of their own instead
# (tests/integration/postgres_private_pair.hpp), so the shared server stays up for the others.
# IDEM_TEST_PG_BIN names the PostgreSQL server binaries' directory in every run.
#
# A Redis Cluster, in every run (six small redis-servers): three primaries holding all 16384 slots,
# one replica each, cluster-node-timeout 2000 ms (a failover takes seconds), each node with its own
# free port and free cluster bus port (cluster-port). The script waits until every node reports
# cluster_state:ok and each primary has its replica attached and in sync. Exports
#   IDEM_TEST_REDIS_CLUSTER_URL    redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/0 (the
#                                  three primaries as formed, as seeds; a failover may move them)
#   IDEM_TEST_REDIS_CLUSTER_PORTS  "P1 P2 P3 P4 P5 P6", every node: primaries first, then replicas
#   IDEM_TEST_REDIS_CLUSTER_DIR    one directory per node, named by its port: PORT/redis.pid,
#                                  PORT/redis.log, PORT/redis.conf, PORT/nodes.conf
#
# A Redis Sentinel group, on request only: IDEM_TEST_REDIS_SENTINEL=1 starts a primary, its replica
# (replicaof) and three sentinels monitoring the primary as "idem" (quorum 2,
# down-after-milliseconds 1000, failover-timeout 5000), and waits until the replica's link is up
# and each sentinel names the primary, knows the replica and has found the other two. Exports
#   IDEM_TEST_REDIS_SENTINEL_URL         redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,
#                                        127.0.0.1:S3/idem
#   IDEM_TEST_REDIS_SENTINEL_MASTER      idem (the monitored name)
#   IDEM_TEST_REDIS_SENTINEL_PORTS       "S1 S2 S3", the sentinels
#   IDEM_TEST_REDIS_SENTINEL_DATA_PORTS  "PRIMARY REPLICA", as started (a failover swaps the roles)
#   IDEM_TEST_REDIS_SENTINEL_DIR         one directory per process (data nodes and sentinels alike),
#                                        named by its port: PORT/redis.pid, PORT/redis.log,
#                                        PORT/redis.conf (which a sentinel rewrites as it learns)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ $# -gt 0 ] || { echo "usage: scripts/servers.sh COMMAND [ARGS...]" >&2; exit 2; }

work=$(mktemp -d /tmp/idem-servers-XXXXXX)
chmod 755 "$work"
export IDEM_TEST_SERVERS_DIR=$work
pids=()
# The ports of this run's Redis Cluster nodes, Sentinel group data nodes and sentinels, each filled
# in before its redis-server starts, so cleanup() finds every pid file.
cluster_ports=()
sentinel_data_ports=()
sentinel_ports=()

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
pg_user=postgres
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$pg_user" -- "$@"; else "$@"; fi
}

# free_port, stop_pid (stopping touches only what this run started, by its own PID), pid_in and
# within_30s come from scripts/lib.sh.
cleanup() {
  set +e
  stop_pid "$(pid_in "$work/redis/redis.pid")"
  stop_pid "$(pid_in "$work/redis-expired/redis.pid")"
  # The sentinels first, so none of them sees its primary go and starts a failover.
  local port
  for port in "${sentinel_ports[@]}" "${sentinel_data_ports[@]}"; do
    stop_pid "$(pid_in "$work/redis-sentinel/$port/redis.pid")"
  done
  for port in "${cluster_ports[@]}"; do
    stop_pid "$(pid_in "$work/redis-cluster/$port/redis.pid")"
  done
  local data
  for data in "${pg_standby_data:-}" "${pg_data:-}" "${pg_tls_data:-}"; do
    [ -n "$data" ] && [ -d "$data" ] || continue
    # pg_ctl stops the postmaster of this data directory (the PID in its postmaster.pid).
    as_pg "$pg_bin/pg_ctl" -D "$data" -m immediate -t 30 stop >/dev/null 2>&1 ||
      stop_pid "$(pid_in "$data/postmaster.pid")"
  done
  if [ -n "${IDEM_TEST_RABBITMQCTL:-}" ]; then
    # This run's node (its name holds this run's AMQP port), then the VM by its pid file.
    $IDEM_TEST_RABBITMQCTL stop "$work/rabbitmq/rabbit.pid" >/dev/null 2>&1
    stop_pid "$(pid_in "$work/rabbitmq/rabbit.pid")"
  fi
  # Last started, first stopped: the rabbitmq-server wrapper, then this run's own epmd.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop_pid "${pids[$i]}"; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- TLS material ----------------------------------------------------------------------------
command -v openssl >/dev/null || { echo "servers.sh: openssl is not installed" >&2; exit 1; }
tls=$work/tls
mkdir -p "$tls"
make_tls() {
  set -e
  cd "$tls"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 30 -subj "/CN=idem test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
  openssl req -x509 "${ec[@]}" -keyout other-ca.key -out other-ca.crt -days 30 \
    -subj "/CN=idem other CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign
  cat >server.ext <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost
EXT
  cat >client.ext <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
  openssl req "${ec[@]}" -keyout server.key -out server.csr -subj "/CN=localhost"
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile server.ext -out server.crt
  openssl req "${ec[@]}" -keyout client.key -out client.csr -subj "/CN=idem_mtls"
  openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile client.ext -out client.crt
  openssl req "${ec[@]}" -keyout rogue-client.key -out rogue-client.csr -subj "/CN=idem_mtls"
  openssl x509 -req -in rogue-client.csr -CA other-ca.crt -CAkey other-ca.key -CAcreateserial \
    -days 30 -extfile client.ext -out rogue-client.crt
  # The expired certificate: `openssl ca` is the one front end that takes explicit dates.
  mkdir -p ca-db && : >ca-db/index.txt && echo 01 >ca-db/serial
  cat >ca.cnf <<CNF
[ca]
default_ca = idem
[idem]
dir = $tls/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $tls/ca.crt
private_key = $tls/ca.key
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
CNF
  openssl ca -batch -config ca.cnf -in server.csr -out server-expired.crt -notext \
    -startdate "$(date -u -d '-3 days' +%Y%m%d%H%M%SZ)" \
    -enddate "$(date -u -d '-1 day' +%Y%m%d%H%M%SZ)" -extfile server.ext
  chmod 644 ./*.crt
  chmod 600 ./*.key
}
if ! (make_tls) >"$tls/openssl.log" 2>&1; then
  echo "servers.sh: making the test certificates failed:" >&2
  cat "$tls/openssl.log" >&2
  exit 1
fi
export IDEM_TEST_TLS_DIR=$tls

# ---- RabbitMQ (started first: the Erlang VM takes several seconds to boot, so it comes up while
# the other two are being set up) ---------------------------------------------------------------
rmq_bin=/usr/lib/rabbitmq/bin
[ -x "$rmq_bin/rabbitmq-server" ] || { echo "servers.sh: rabbitmq-server is not installed" >&2; exit 1; }
amqp_port=$(free_port)
amqps_port=$(free_port)
rmq_dist_port=$(free_port)
rmq_node=idem_$amqp_port@localhost
mkdir -p "$work/rabbitmq"
cat >"$work/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$amqp_port
listeners.ssl.1 = 127.0.0.1:$amqps_port
ssl_options.cacertfile = $tls/ca.crt
ssl_options.certfile = $tls/server.crt
ssl_options.keyfile = $tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
loopback_users = none
log.console = false
log.file.level = warning
EOF
echo '[].' >"$work/rabbitmq/enabled_plugins"
# An epmd (Erlang's node-name registry) of this run's own, on a free port: the VM would otherwise
# use, or start, the machine's shared one on 4369, which another run (or the machine's own
# RabbitMQ) may be using, so no run could stop it without breaking the others. The server and
# rabbitmqctl find it through ERL_EPMD_PORT.
command -v epmd >/dev/null || { echo "servers.sh: epmd (erlang-base) is not installed" >&2; exit 1; }
epmd_port=$(free_port)
epmd -address 127.0.0.1 -port "$epmd_port" >"$work/rabbitmq/epmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  epmd -port "$epmd_port" -names >/dev/null 2>&1 && break
  sleep 0.1
done
epmd -port "$epmd_port" -names >/dev/null 2>&1 ||
  { echo "servers.sh: epmd did not start on port $epmd_port" >&2; cat "$work/rabbitmq/epmd.out" >&2; exit 1; }
# HOME holds the Erlang cookie shared by the server and rabbitmqctl.
rmq_env=(env HOME="$work/rabbitmq" ERL_EPMD_PORT="$epmd_port" RABBITMQ_NODENAME="$rmq_node"
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  RABBITMQ_NODE_PORT="$amqp_port" RABBITMQ_DIST_PORT="$rmq_dist_port" ERL_EPMD_ADDRESS=127.0.0.1
  RABBITMQ_MNESIA_BASE="$work/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$work/rabbitmq/log"
  RABBITMQ_CONFIG_FILE="$work/rabbitmq/rabbitmq" RABBITMQ_PID_FILE="$work/rabbitmq/rabbit.pid"
  RABBITMQ_ENABLED_PLUGINS_FILE="$work/rabbitmq/enabled_plugins")
"${rmq_env[@]}" "$rmq_bin/rabbitmq-server" >"$work/rabbitmq/server.out" 2>&1 &
pids+=($!)
export IDEM_TEST_RABBITMQCTL="env HOME=$work/rabbitmq ERL_EPMD_PORT=$epmd_port $rmq_bin/rabbitmqctl -n $rmq_node"

# ---- Redis -----------------------------------------------------------------------------------
command -v redis-server >/dev/null || { echo "servers.sh: redis-server is not installed" >&2; exit 1; }
redis_port=$(free_port)
redis_tls_port=$(free_port)
mkdir -p "$work/redis"
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" --save "" \
  --tls-port "$redis_tls_port" --tls-cert-file "$tls/server.crt" --tls-key-file "$tls/server.key" \
  --tls-ca-cert-file "$tls/ca.crt" --tls-auth-clients yes \
  --appendonly no --daemonize yes --logfile "$work/redis/redis.log" \
  --pidfile "$work/redis/redis.pid" >/dev/null
for _ in $(seq 1 100); do
  redis-cli -h 127.0.0.1 -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -h 127.0.0.1 -p "$redis_port" ping >/dev/null || { cat "$work/redis/redis.log" >&2; exit 1; }
export IDEM_TEST_REDIS_URL="redis://127.0.0.1:${redis_port}/0"
export IDEM_TEST_REDIS_PORT=$redis_port
export IDEM_TEST_REDIS_TLS_PORT=$redis_tls_port
redis_expired_port=$(free_port)
mkdir -p "$work/redis-expired"
redis-server --bind 127.0.0.1 --port 0 --dir "$work/redis-expired" --save "" \
  --tls-port "$redis_expired_port" --tls-cert-file "$tls/server-expired.crt" \
  --tls-key-file "$tls/server.key" --tls-ca-cert-file "$tls/ca.crt" --tls-auth-clients no \
  --appendonly no --daemonize yes --logfile "$work/redis-expired/redis.log" \
  --pidfile "$work/redis-expired/redis.pid" >/dev/null
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$redis_expired_port") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$redis_expired_port") 2>/dev/null ||
  { cat "$work/redis-expired/redis.log" >&2; exit 1; }
export IDEM_TEST_REDIS_TLS_EXPIRED_PORT=$redis_expired_port

# The settings every Redis Cluster node and Sentinel group data node shares, for DIR/redis.conf:
# redis_conf DIR PORT. No diskless-sync delay: a replica's first sync starts at once, not in 5 s.
redis_conf() {
  printf '%s\n' "port $2" "bind 127.0.0.1" "protected-mode no" "daemonize yes" \
    "pidfile $1/redis.pid" "logfile $1/redis.log" "dir $1" 'save ""' "appendonly no" \
    "repl-diskless-sync-delay 0"
}
# redis_start DIR PORT [ARGS...]: starts `redis-server DIR/redis.conf ARGS...` (it daemonizes) and
# waits up to 10 s for it to answer PING on PORT; if it does not, prints its log and exits.
redis_start() {
  local dir=$1 port=$2
  shift 2
  redis-server "$dir/redis.conf" "$@" >/dev/null || true
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "servers.sh: the redis-server in $dir did not start" >&2
  cat "$dir/redis.log" >&2 2>/dev/null
  exit 1
}

# ---- Redis Cluster ---------------------------------------------------------------------------
command -v redis-cli >/dev/null || { echo "servers.sh: redis-cli is not installed" >&2; exit 1; }
cluster_dir=$work/redis-cluster
mkdir -p "$cluster_dir"
# Twelve ports: a client port and a cluster bus port (cluster-port) for each node.
port_list=$(free_port 12)
mapfile -t ports <<<"$port_list"
for i in 0 1 2 3 4 5; do
  port=${ports[$i]}
  cluster_ports+=("$port")
  mkdir -p "$cluster_dir/$port"
  { redis_conf "$cluster_dir/$port" "$port"
    printf '%s\n' "cluster-enabled yes" "cluster-config-file nodes.conf" \
      "cluster-node-timeout 2000" "cluster-port ${ports[$((i + 6))]}"
  } >"$cluster_dir/$port/redis.conf"
  redis_start "$cluster_dir/$port" "$port"
done
# Prints the logs of the cluster's forming and of every node, then exits.
cluster_fail() {
  echo "servers.sh: the Redis Cluster $1" >&2
  local port
  cat "$cluster_dir/create.log" >&2 2>/dev/null
  for port in "${cluster_ports[@]}"; do
    echo "--- node $port" >&2
    cat "$cluster_dir/$port/redis.log" >&2 2>/dev/null
  done
  exit 1
}
# redis-cli makes the first three nodes primaries, with the slots split between them, and the
# other three their replicas.
redis-cli --cluster create "${cluster_ports[@]/#/127.0.0.1:}" --cluster-replicas 1 --cluster-yes \
  >"$cluster_dir/create.log" 2>&1 </dev/null || cluster_fail "was not formed"
# Ready when every node sees the whole cluster (state ok, three shards, six nodes, three of them
# replicas, none failing or still in handshake), each of the first three is a primary with its
# replica online (its first sync done) and each of the other three a replica with its link up.
cluster_ready() {
  local i port info
  for i in 0 1 2 3 4 5; do
    port=${cluster_ports[$i]}
    info=$(redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null) || return 1
    [[ $info == *cluster_state:ok* && $info == *cluster_size:3* &&
      $info == *cluster_known_nodes:6* ]] || return 1
    redis-cli -h 127.0.0.1 -p "$port" cluster nodes 2>/dev/null | awk '
      $3 ~ /fail|handshake|noaddr/ || $8 != "connected" { bad = 1 }
      $3 ~ /slave/ { n++ }
      END { exit bad || n != 3 }' || return 1
    info=$(redis-cli -h 127.0.0.1 -p "$port" info replication 2>/dev/null) || return 1
    if [ "$i" -lt 3 ]; then
      [[ $info == *role:master*connected_slaves:1*state=online* ]] || return 1
    else
      [[ $info == *role:slave*master_link_status:up* ]] || return 1
    fi
  done
}
within_30s cluster_ready || cluster_fail "did not become ready in 30 s"
export IDEM_TEST_REDIS_CLUSTER_URL="redis+cluster://127.0.0.1:${cluster_ports[0]},127.0.0.1:${cluster_ports[1]},127.0.0.1:${cluster_ports[2]}/0"
export IDEM_TEST_REDIS_CLUSTER_PORTS="${cluster_ports[*]}"
export IDEM_TEST_REDIS_CLUSTER_DIR=$cluster_dir

# ---- Redis Sentinel (on request) -------------------------------------------------------------
if [ "${IDEM_TEST_REDIS_SENTINEL:-0}" = 1 ]; then
  sentinel_dir=$work/redis-sentinel
  mkdir -p "$sentinel_dir"
  port_list=$(free_port 5)
  mapfile -t ports <<<"$port_list"
  sentinel_data_ports=("${ports[@]:0:2}")
  sentinel_primary=${sentinel_data_ports[0]}
  for port in "${sentinel_data_ports[@]}"; do
    mkdir -p "$sentinel_dir/$port"
    { redis_conf "$sentinel_dir/$port" "$port"
      [ "$port" = "$sentinel_primary" ] || echo "replicaof 127.0.0.1 $sentinel_primary"
    } >"$sentinel_dir/$port/redis.conf"
    redis_start "$sentinel_dir/$port" "$port"
  done
  # Prints the log of every process of the group, then exits.
  sentinel_fail() {
    echo "servers.sh: the Redis Sentinel group $1" >&2
    local port
    for port in "${sentinel_data_ports[@]}" "${sentinel_ports[@]}"; do
      echo "--- $port" >&2
      cat "$sentinel_dir/$port/redis.log" >&2 2>/dev/null
    done
    exit 1
  }
  # The replica first: a sentinel learns of it from the primary's INFO when it connects.
  for _ in $(seq 1 300); do
    redis-cli -h 127.0.0.1 -p "${sentinel_data_ports[1]}" info replication 2>/dev/null |
      grep -q '^master_link_status:up' && break
    sleep 0.1
  done
  redis-cli -h 127.0.0.1 -p "${sentinel_data_ports[1]}" info replication 2>/dev/null |
    grep -q '^master_link_status:up' || sentinel_fail "replica did not sync in 30 s"
  # A sentinel rewrites its config file (the replicas, sentinels and epoch it learns), so each
  # has its own directory. redis-sentinel is only another name for redis-server --sentinel.
  for port in "${ports[@]:2:3}"; do
    sentinel_ports+=("$port")
    mkdir -p "$sentinel_dir/$port"
    printf '%s\n' "port $port" "bind 127.0.0.1" "protected-mode no" "daemonize yes" \
      "pidfile $sentinel_dir/$port/redis.pid" "logfile $sentinel_dir/$port/redis.log" \
      "dir $sentinel_dir/$port" "sentinel resolve-hostnames no" \
      "sentinel monitor idem 127.0.0.1 $sentinel_primary 2" \
      "sentinel down-after-milliseconds idem 1000" "sentinel failover-timeout idem 5000" \
      >"$sentinel_dir/$port/redis.conf"
    redis_start "$sentinel_dir/$port" "$port" --sentinel
  done
  # Ready when each sentinel names the primary, sees it up, has INFO from the replica (its link
  # to the primary ok) and has found the other two sentinels (their hello messages, every 2 s).
  sentinel_ready() {
    local port
    for port in "${sentinel_ports[@]}"; do
      [ "$(redis-cli -h 127.0.0.1 -p "$port" sentinel get-master-addr-by-name idem 2>/dev/null |
        paste -sd:)" = "127.0.0.1:$sentinel_primary" ] || return 1
      redis-cli -h 127.0.0.1 -p "$port" sentinel master idem 2>/dev/null | awk '
        key == "flags" { ok += $0 == "master" }
        key == "num-slaves" { ok += $0 == 1 }
        key == "num-other-sentinels" { ok += $0 == 2 }
        { key = (key == "" ? $0 : "") }
        END { exit ok != 3 }' || return 1
      redis-cli -h 127.0.0.1 -p "$port" sentinel replicas idem 2>/dev/null | awk '
        key == "flags" { ok += $0 == "slave" }
        key == "master-link-status" { ok += $0 == "ok" }
        { key = (key == "" ? $0 : "") }
        END { exit ok != 2 }' || return 1
    done
  }
  within_30s sentinel_ready || sentinel_fail "did not become ready in 30 s"
  export IDEM_TEST_REDIS_SENTINEL_URL="redis+sentinel://127.0.0.1:${sentinel_ports[0]},127.0.0.1:${sentinel_ports[1]},127.0.0.1:${sentinel_ports[2]}/idem"
  export IDEM_TEST_REDIS_SENTINEL_MASTER=idem
  export IDEM_TEST_REDIS_SENTINEL_PORTS="${sentinel_ports[*]}"
  export IDEM_TEST_REDIS_SENTINEL_DATA_PORTS="${sentinel_data_ports[*]}"
  export IDEM_TEST_REDIS_SENTINEL_DIR=$sentinel_dir
fi

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
export IDEM_TEST_PG_BIN=$pg_bin

if [ "${IDEM_TEST_POSTGRES_STANDBY:-0}" = 1 ]; then
  # initdb's pg_hba lets idem replicate from 127.0.0.1 (trust), and PostgreSQL 15's defaults
  # (wal_level=replica, max_wal_senders=10) serve a standby: the primary needs no restart.
  pg_standby_port=$(free_port)
  pg_standby_data=$work/pg-standby/data
  mkdir -p "$work/pg-standby"
  if [ "$(id -u)" -eq 0 ]; then chown -R "$pg_user" "$work/pg-standby"; fi
  as_pg "$pg_bin/psql" -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U idem -d postgres \
    -c "SELECT pg_create_physical_replication_slot('idem_standby')" >/dev/null
  as_pg "$pg_bin/pg_basebackup" -h 127.0.0.1 -p "$pg_port" -U idem -D "$pg_standby_data" -R \
    -S idem_standby -X stream --checkpoint=fast --no-sync
  as_pg "$pg_bin/pg_ctl" -D "$pg_standby_data" -l "$work/pg-standby/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $pg_standby_port -k $work/pg-standby -c fsync=off \
        -c max_connections=200 -c hot_standby=on" start >/dev/null ||
    { cat "$work/pg-standby/postgres.log" >&2; exit 1; }
  pg_primary_sql() {
    as_pg "$pg_bin/psql" -qtA -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U idem -d postgres \
      -c "$1"
  }
  # Waits up to 30 s until the primary lists one standby matching the condition $1.
  pg_wait_standby() {
    local query="SELECT count(*) FROM pg_stat_replication WHERE $1"
    for _ in $(seq 1 300); do
      [ "$(pg_primary_sql "$query")" = 1 ] && return 0
      sleep 0.1
    done
    echo "servers.sh: the PostgreSQL standby $2" >&2
    exit 1
  }
  pg_wait_standby "state = 'streaming'" "does not stream"
  if [ "${IDEM_TEST_POSTGRES_SYNC:-0}" = 1 ]; then
    pg_primary_sql "ALTER SYSTEM SET synchronous_standby_names = '*'" >/dev/null
    pg_primary_sql "SELECT pg_reload_conf()" >/dev/null
    pg_wait_standby "sync_state = 'sync'" "did not become synchronous"
  fi
  export IDEM_TEST_POSTGRES_STANDBY_URL="postgresql://idem@127.0.0.1:${pg_standby_port}/idem_test"
  export IDEM_TEST_POSTGRES_STANDBY_PORT=$pg_standby_port
  export IDEM_TEST_POSTGRES_FAILOVER_URL="postgresql://idem@127.0.0.1:${pg_port},127.0.0.1:${pg_standby_port}/idem_test?target_session_attrs=read-write"
  export IDEM_TEST_PG_STANDBY_CTL_CMD="$pg_bin/pg_ctl -D $pg_standby_data"
fi

# A second PostgreSQL that takes TLS connections only (every pg_hba rule is hostssl), so the
# plain one above keeps libpq's default sslmode=prefer from encrypting the other tests.
pg_tls_port=$(free_port)
pg_tls_data=$work/pg-tls/data
mkdir -p "$work/pg-tls"
cp "$tls/server.crt" "$tls/server.key" "$tls/ca.crt" "$work/pg-tls/"
if [ "$(id -u)" -eq 0 ]; then chown -R "$pg_user" "$work/pg-tls"; fi
as_pg "$pg_bin/initdb" -D "$pg_tls_data" -U idem --auth=trust -E UTF8 --no-sync >/dev/null
cat >"$work/pg-tls/pg_hba.conf" <<EOF
local all all trust
hostssl all idem 127.0.0.1/32 trust
hostssl all idem ::1/128 trust
hostssl all idem_mtls 127.0.0.1/32 scram-sha-256 clientcert=verify-full
hostssl all idem_mtls ::1/128 scram-sha-256 clientcert=verify-full
hostnossl all idem_plain 127.0.0.1/32 scram-sha-256
hostnossl all idem_plain ::1/128 scram-sha-256
hostssl all all 127.0.0.1/32 scram-sha-256
hostssl all all ::1/128 scram-sha-256
EOF
if [ "$(id -u)" -eq 0 ]; then chown "$pg_user" "$work/pg-tls/pg_hba.conf"; fi
as_pg "$pg_bin/pg_ctl" -D "$pg_tls_data" -l "$work/pg-tls/postgres.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $pg_tls_port -k $work/pg-tls -c fsync=off \
      -c max_connections=100 -c ssl=on -c ssl_cert_file=$work/pg-tls/server.crt \
      -c ssl_key_file=$work/pg-tls/server.key -c ssl_ca_file=$work/pg-tls/ca.crt \
      -c hba_file=$work/pg-tls/pg_hba.conf -c password_encryption=scram-sha-256" \
  start >/dev/null || { cat "$work/pg-tls/postgres.log" >&2; exit 1; }
pg_tls_password=$(openssl rand -hex 16)
printf '%s\n' "$pg_tls_password" >"$tls/pg-password"
chmod 600 "$tls/pg-password"
as_pg "$pg_bin/psql" -q -v ON_ERROR_STOP=1 -h "$work/pg-tls" -p "$pg_tls_port" -U idem \
  -d postgres >/dev/null <<EOF
CREATE ROLE idem_tls LOGIN PASSWORD '$pg_tls_password';
CREATE ROLE idem_mtls LOGIN PASSWORD '$pg_tls_password';
CREATE ROLE idem_plain LOGIN PASSWORD '$pg_tls_password';
CREATE DATABASE idem_test OWNER idem_tls;
GRANT CREATE ON DATABASE idem_test TO idem_mtls, idem_plain;
EOF
export IDEM_TEST_POSTGRES_TLS_PORT=$pg_tls_port
export IDEM_TEST_POSTGRES_TLS_PASSWORD=$pg_tls_password
export IDEM_TEST_POSTGRES_TLS_URL="postgresql://idem_tls@localhost:${pg_tls_port}/idem_test?sslmode=verify-full&sslrootcert=$tls/ca.crt"
export IDEM_TEST_POSTGRES_TLS_ADMIN_URL="host=$work/pg-tls port=$pg_tls_port user=idem dbname=idem_test"

if ! $IDEM_TEST_RABBITMQCTL wait "$work/rabbitmq/rabbit.pid" --timeout 120 >/dev/null 2>&1; then
  echo "servers.sh: rabbitmq-server did not start" >&2
  cat "$work/rabbitmq/server.out" "$work/rabbitmq/log/"*.log >&2 2>/dev/null
  exit 1
fi
export IDEM_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:${amqp_port}/"
export IDEM_TEST_AMQP_PORT=$amqp_port
export IDEM_TEST_AMQPS_URL="amqps://guest:guest@localhost:${amqps_port}/?cacertfile=$tls/ca.crt&certfile=$tls/client.crt&keyfile=$tls/client.key"
export IDEM_TEST_AMQPS_PORT=$amqps_port

sentinel_note="sentinels ${sentinel_ports[*]} on ${sentinel_data_ports[*]}"
echo "servers.sh: redis on $redis_port (TLS $redis_tls_port), redis cluster on" \
  "${cluster_ports[*]}${sentinel_ports[*]:+, redis $sentinel_note}, postgresql on $pg_port (TLS" \
  "$pg_tls_port${pg_standby_port:+, standby $pg_standby_port}), rabbitmq on $amqp_port" \
  "(TLS $amqps_port) (dir $work)" >&2
set +e
"$@"
status=$?
exit $status
