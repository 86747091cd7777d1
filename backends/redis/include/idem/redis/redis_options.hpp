// Options for idem's Redis backend: where the server is, how long to wait for it, how many
// connections to keep, and how idem names its keys.
//
// RedisOptions is a plain struct; every field has a default, so `RedisOptions{}` talks to
// redis://127.0.0.1:6379/0 with the key prefix "idem:". It can also be built from a URL:
//
//   redis://[[user]:password@]host[:port][/db][?param=value&...]
//   rediss://...   the same over TLS (RedisOptions::tls is set; see RedisTlsOptions)
//   redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0][?param=value&...]
//   rediss+cluster://...   a Redis Cluster (plaintext or TLS), given by any of its nodes
//                          (RedisOptions::cluster_nodes; see docs/redis.md, "Redis Cluster")
//   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name[/db][?...]
//   rediss+sentinel://...  a primary watched by a Redis Sentinel group, given by its sentinels
//                          (port 26379 by default) and the name they monitor it under
//                          (RedisOptions::sentinel_nodes; see docs/redis.md, "Redis Sentinel");
//                          the user info is the primary's, the sentinels' own password comes
//                          from sentinel_user / sentinel_password_file / sentinel_password_env
//
// with these query parameters (each one sets the field of the same name):
//   prefix=app:            key_prefix (percent-decoded, so prefix=%7Bapp%7D: gives "{app}:")
//   pool_size=8            pool_size              async_connections=1    async_connections
//   connect_timeout=1s     connect_timeout        command_timeout=2s     command_timeout
//   wait_timeout=1s        wait_timeout           marker_ttl=7d          marker_ttl
//   min_replicas=N         min_replicas           replica_timeout=500ms  replica_timeout
//   expiry_slack=1h        expiry_slack           scan_count=N           scan_count
//     (durations as in every idem URL, idem/duration.hpp: 500ms, 30s, 15m, 12h, 7d, at most
//     1000d; each also as <name>_ms=N in bare milliseconds, the older spelling)
//   password_file=PATH     password (read once, here)   password_env=NAME  password from $NAME
//   sentinel_user=NAME     sentinel_username      sentinel_password_file=PATH / _env=NAME
//                                                 sentinel_password (redis+sentinel:// only)
// and, with rediss:// only (each sets the RedisTlsOptions field of the same name):
//   tls_ca_file=PATH       ca_file        tls_ca_dir=DIR          ca_dir
//   tls_cert_file=PATH     cert_file      tls_key_file=PATH       key_file
//   tls_key_password_file=PATH / tls_key_password_env=NAME        key_password (read once, here)
//   tls_server_name=NAME   server_name    tls_verify=yes|no       verify_peer
// e.g. "redis://:secret@10.0.0.5:6380/2?prefix=orders:&pool_size=16",
// "redis+cluster://10.0.0.5:7000,10.0.0.6:7000,10.0.0.7:7000/?prefix=orders:", or
// "rediss://app:@redis.internal:6380/0?password_file=/run/secrets/redis&tls_ca_file=/etc/ca.pem".
// Anything malformed — another scheme, a bad port, db, number or duration, an unknown
// parameter, a parameter given twice, both spellings of one duration (wait_timeout and
// wait_timeout_ms), a tls_ parameter on redis://, several hosts on redis://, a database other
// than 0 on a cluster, a Sentinel URL without a master name — throws ConfigError naming
// the offending part;
// the password and the key passphrase are never repeated in a message.
//
// Thread-safety: a plain value; copy it freely.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/tls_options.hpp"

namespace idem::redis {

// TLS to the server (rediss://): idem::TlsOptions (idem/tls_options.hpp — CA file or directory,
// client certificate and key, key_password, server_name, verify_peer), under the name the Redis
// backend has always used. The TLS context — CA, certificate and key, read from their files — is
// built once per ConnectionPool / AsyncConnectionPool when it is made (a file that cannot be used
// is a ConfigError there) and shared by all of its connections; a file replaced later is read by
// the next pool. A handshake that fails (an untrusted or expired certificate, a host name
// mismatch, a client certificate the server refuses, a plaintext port) fails the call with a
// non-retryable RedisError (RedisFailure::tls, redis_error.hpp).
using RedisTlsOptions = ::idem::TlsOptions;

// One node of a Redis Cluster, as given to find the cluster (RedisOptions::cluster_nodes).
struct RedisNode {
  std::string host;
  int port = 6379;
};

struct RedisOptions {
  // Server host name or IP address. Default "127.0.0.1". On a cluster, the first of
  // cluster_nodes (set by from_url; otherwise unused).
  std::string host = "127.0.0.1";
  // Server TCP port, 1..65535. Default 6379.
  int port = 6379;
  // Logical database selected on every new connection (SELECT), >= 0. Default 0. A cluster has
  // database 0 only.
  int db = 0;
  // Redis Cluster: the nodes idem asks for the cluster's layout (CLUSTER SHARDS), any number,
  // any role; the first that answers is used, the others when it is down. Each command then
  // goes to the primary that serves its key's slot, following MOVED and ASK redirections (see
  // docs/redis.md, "Redis Cluster"). Empty (the default): one server at host:port. Every other
  // option applies to each node (credentials, TLS, timeouts, pool_size per node).
  std::vector<RedisNode> cluster_nodes{};
  // Redis Sentinel: the sentinels to ask which server is the primary named sentinel_master
  // (SENTINEL get-master-addr-by-name), any number; the first that answers is used. Every new
  // connection asks, then checks the server's ROLE is master, so a pool follows a failover by
  // itself: connections to a demoted primary are dropped (-READONLY, or the +switch-master
  // message a blocking pool subscribes to), and the next ones go to the promoted replica (see
  // docs/redis.md, "Redis Sentinel"). Empty (the default): no Sentinel. host, port, the
  // credentials, db and TLS apply to the primary; TLS also to the sentinels.
  std::vector<RedisNode> sentinel_nodes{};
  // The name the sentinels monitor the primary under ("sentinel monitor <name> ..."). Required
  // with sentinel_nodes; no spaces or control characters.
  std::string sentinel_master{};
  // AUTH for the sentinels themselves (a sentinel run with requirepass or an ACL user), separate
  // from the primary's. Default none.
  std::optional<std::string> sentinel_username{};
  std::optional<std::string> sentinel_password{};
  // ACL user name sent with AUTH (Redis 6+); only used together with a password. Default none
  // (AUTH <password> alone, the "default" user).
  std::optional<std::string> username{};
  // Password sent with AUTH on every new connection. Default none (no AUTH).
  std::optional<std::string> password{};
  // TLS for every connection (blocking and coroutine face). Default none (plaintext).
  std::optional<RedisTlsOptions> tls{};

  // The longest a new connection may take to establish (TCP connect). When the server is down
  // or unreachable a call fails after at most this long with a retryable RedisError; there is no
  // retry loop inside idem. Must be > 0. Default 1 s.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(1);
  // The longest one command (or one pipelined batch) may wait to be sent or answered. A command
  // that times out fails with a retryable RedisError (in doubt for writes) and its connection is
  // dropped. Must be > 0. Default 2 s.
  std::chrono::milliseconds command_timeout = std::chrono::seconds(2);
  // Connections the pool opens at most; a call holds one for its duration. Must be >= 1.
  // Default 8.
  std::size_t pool_size = 8;
  // The coroutine face (AsyncConnectionPool): how many pipelined connections serve every
  // coroutine of one async recorder or store. One connection carries any number of concurrent
  // calls; a second helps only when one socket's bandwidth or the server's per-client work is the
  // limit. On a cluster: one per primary, whatever this says. 1..64. Default 1.
  std::size_t async_connections = 1;
  // The longest a call waits for a connection when all pool_size are busy, before failing with
  // a retryable RedisError (pool_exhausted). Must be >= 0; 0 fails at once. Default 1 s.
  std::chrono::milliseconds wait_timeout = std::chrono::seconds(1);

  // Durability across a failover: when > 0, every write idem sends (claims, completions, marks,
  // releases, purges) is followed on the same connection by WAIT min_replicas replica_timeout, and
  // a write that fewer than min_replicas replicas confirmed within replica_timeout is reported as
  // a RedisError in doubt (retryable for idempotent writes such as marks), never as success: it
  // is on the primary, but a failover may lose it. Reads are not delayed. On a cluster each
  // primary waits for its own replicas. 0..100; default 0 (no wait: replication is asynchronous,
  // see docs/redis.md, "Durability across failover").
  std::size_t min_replicas = 0;
  // The longest one write waits for its replicas (WAIT's timeout). Must be > 0, and with
  // min_replicas shorter than command_timeout (the reply to WAIT is read within it). Default
  // 500 ms.
  std::chrono::milliseconds replica_timeout = std::chrono::milliseconds(500);

  // Prepended to every key idem writes, so several applications (or tests) share one database.
  // Any bytes but control characters; at most 128 bytes. A hash tag in it ("{app}:") pins
  // every idem key to one cluster slot (see docs/redis.md). Default "idem:".
  std::string key_prefix = "idem:";

  // Recorder: markers expire this long after they were written (SET ... PX), so Redis forgets
  // old markers by itself. A marker that expired counts as unprocessed, exactly like a purged
  // one: keep it longer than the transport's longest redelivery window. Must be > 0 when set.
  // Default none (markers live until purge()).
  std::optional<std::chrono::milliseconds> marker_ttl{};
  // Store and recorder: every record and claim gets a Redis expiry (PEXPIREAT) at its own end —
  // a result's expires_at, a claim's lease_until — plus this slack, so Redis reclaims the space
  // of dead records. idem decides liveness itself from the stored times on every read; the slack
  // only has to cover clock skew between clients and the server, and how long an owner past its
  // lease may still complete (after lease_until + slack its claim is gone). Must be >= 0.
  // Default 1 h.
  std::chrono::milliseconds expiry_slack = std::chrono::hours(1);
  // The COUNT hint of the SCAN calls behind purge(), purge_expired() and entry_count(). Must be
  // >= 1. Default 1000.
  std::size_t scan_count = 1000;

  // Wall time for marker timestamps, lease deadlines and expiries; passed into every script as
  // an argument (milliseconds since the epoch), so the server's own clock is never used.
  // Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock{};

  // True with cluster_nodes: a Redis Cluster.
  bool is_cluster() const noexcept { return !cluster_nodes.empty(); }
  // True with sentinel_nodes: a primary found through Redis Sentinel.
  bool is_sentinel() const noexcept { return !sentinel_nodes.empty(); }

  // Parses a redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or
  // rediss+sentinel:// URL (see the top of this
  // file). Fields the URL does not mention keep their defaults. Throws ConfigError naming the part
  // that is wrong.
  static RedisOptions from_url(std::string_view url);

  // Throws ConfigError naming the first field that is out of range. Called by every constructor
  // that takes options.
  void validate() const;

  // "host:port/db", "cluster host:port,host:port" or "sentinel name/db via host:port,..." — for
  // messages (never includes the
  // password).
  std::string endpoint() const;
};

}  // namespace idem::redis
