// ConnectionPool: a bounded set of blocking hiredis connections, lent out one call at a time.
//
// Every Redis call idem makes borrows a connection with lease() and gives it back when the
// ConnectionLease goes out of scope (RAII): the connection returns to the pool, or — when it
// broke during the call (reset, EOF, timeout, a reply idem could not parse) — it is closed and
// forgotten, so the next lease opens a fresh one. That is how the pool "reconnects": after a
// server restart the idle connections are found dead (checked without a round trip when they are
// leased, and anyway on first use) and replaced one lease at a time. There is no retry loop:
// when the server is down, lease() fails within RedisOptions::connect_timeout with a retryable
// RedisError, and the caller decides what to do.
//
// The pool opens connections lazily, up to RedisOptions::pool_size; when all are leased, lease()
// waits up to RedisOptions::wait_timeout for one to come back. Each new connection sends AUTH
// (when a password is set) and SELECT (when db != 0) before it is lent out, and has
// command_timeout applied to every send and receive. With RedisOptions::tls, the TLS handshake
// follows the TCP connect within the same connect_timeout; the pool builds its TLS context once
// (so a CA or key file that cannot be used is a ConfigError from the constructor) and every
// connection, also every reconnect, uses it.
//
// RedisConnection speaks RESP over an idem::net::Stream, the byte stream the coroutine face
// (async_connection.hpp) uses too: commands are formatted into one buffer and sent with
// MSG_NOSIGNAL (a dead server never raises SIGPIPE), replies are parsed by hiredis's RESP reader;
// every send and receive waits with poll() up to its deadline. It supports pipelining: append() any
// number of commands, then read() their replies in order — one write and one round trip for the
// batch.
//
// On a Redis Cluster (RedisOptions::cluster_nodes) each pooled connection is a set of connections,
// one per primary it has needed, and routes every command to the primary of its key's slot,
// following the cluster's redirections; a pipeline is split by node and its replies come back in
// the order the commands were queued (docs/redis.md, "Redis Cluster"). pool_size bounds these sets.
//
// Thread-safety: ConnectionPool is safe to share between threads (lease(), stats()). A lease and
// its RedisConnection belong to one thread at a time. The pool must outlive its leases.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/fork.hpp"
#include "idem/redis/redis_options.hpp"

// Public headers never include <hiredis/hiredis.h> nor idem/net.
namespace idem::net {
class Stream;
class TlsContext;
struct Address;
}  // namespace idem::net
namespace idem::redis::detail {
class ReplyReader;
class ClusterMap;
class ClusterRouting;
class SentinelGroup;
struct ConnectionAccess;
}  // namespace idem::redis::detail

namespace idem::redis {

// One reply, copied out of hiredis (RESP2 types).
struct RedisReply {
  enum class Type { nil, status, error, integer, string, array };
  Type type = Type::nil;
  long long integer = 0;             // Type::integer
  std::string str;                   // Type::status, Type::error, Type::string
  std::vector<RedisReply> elements;  // Type::array

  bool is_nil() const noexcept { return type == Type::nil; }
  bool is_error() const noexcept { return type == Type::error; }
};

// What a command does to the data, so a lost reply is classified correctly (redis_error.hpp).
enum class CommandKind {
  read,              // changes nothing: a lost reply is simply retryable
  write,             // a lost reply leaves the outcome in doubt; repeating it is not safe
  idempotent_write,  // a lost reply leaves the outcome in doubt, but repeating it is harmless
};

class RedisConnection {
 public:
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends one command and waits for its reply. An error reply (-ERR ...) is returned, not
  // thrown; a failure of the connection throws RedisError and leaves the connection broken().
  // `what` names the operation in error messages ("claim", "purge", ...). Not while pipelined
  // commands are queued (InvalidArgument: read_replies() first).
  RedisReply command(std::span<const std::string_view> args, CommandKind kind = CommandKind::write,
                     std::string_view what = "command");
  RedisReply command(std::initializer_list<std::string_view> args,
                     CommandKind kind = CommandKind::write, std::string_view what = "command");

  // Pipelining: queue a command without sending it ...
  void append(std::span<const std::string_view> args);
  void append(std::initializer_list<std::string_view> args);
  // ... then send everything queued in one write and read every reply, in order. A lost
  // connection throws RedisError: in doubt when `kind` writes and at least one whole command had
  // been handed to the network.
  std::vector<RedisReply> read_replies(CommandKind kind = CommandKind::write,
                                       std::string_view what = "pipeline");
  std::size_t pending() const noexcept;

  // The connection failed and must not be used again (the pool closes it).
  bool broken() const noexcept;
  // "host:port/db", for messages (on a cluster: the node the last command went to).
  const std::string& endpoint() const noexcept;

  // After SUBSCRIBE (or SSUBSCRIBE, on a cluster: the node it was routed to) through command():
  // the next message the server pushes, or nullopt when none arrives by `deadline`. Throws
  // RedisError when the connection fails (it is then broken()). Use a connection of its own
  // (ConnectionPool::open_dedicated()): a subscribed connection takes no other commands.
  std::optional<RedisReply> next_push(std::chrono::steady_clock::time_point deadline);

 private:
  friend class ConnectionPool;
  friend class detail::ClusterMap;
  friend class detail::ClusterRouting;
  friend class detail::SentinelGroup;
  friend struct detail::ConnectionAccess;
  // On a cluster: connections to its nodes, opened as commands need them (cluster.hpp).
  explicit RedisConnection(std::shared_ptr<detail::ClusterMap> cluster);
  // Connects (and TLS handshake), applies timeouts, AUTH and SELECT. Throws RedisError (connect,
  // tls, auth).
  RedisConnection(const RedisOptions& options, std::shared_ptr<const net::TlsContext> tls);

  // True when the idle connection shows a hang-up or unexpected data (checked with poll(), no
  // round trip): it must be replaced.
  bool looks_dead() noexcept;
  // With Sentinel: the primary this connection was opened to has been replaced since.
  bool outdated() const noexcept;
  // A read or write failed before the first reply: the TLS cause when one side does not speak
  // TLS or the server refused the TLS session (empty otherwise).
  std::string tls_mismatch(int error_number, bool eof);
  void send_pending(CommandKind kind, std::string_view what);
  RedisReply read_one(CommandKind kind, std::string_view what, bool any_sent);
  [[noreturn]] void fail_io(std::string_view what, int error_number, bool sent, CommandKind kind,
                            const std::string& detail, bool protocol = false, bool eof = false);
  // The first bytes of the connection are not RESP: wrong_protocol.
  [[noreturn]] void not_redis(std::string_view what);
  // With min_replicas: the reply to the WAIT queued after a write. Throws RedisError (in doubt)
  // when fewer replicas confirmed it, unless every write it followed failed (`no_write`).
  void check_wait(const RedisReply& wait, bool no_write, CommandKind kind, std::string_view what);

  std::chrono::milliseconds command_timeout_;
  std::chrono::milliseconds connect_timeout_;
  std::shared_ptr<const net::TlsContext> tls_;  // null without TLS
  std::string host_;
  bool received_ = false;    // a byte arrived on this connection
  bool replied_ = false;     // a whole reply arrived on this connection
  std::string first_bytes_;  // the first bytes that arrived, for a wrong_protocol message
  std::vector<net::Address> addresses_;
  std::unique_ptr<net::Stream> stream_;
  std::unique_ptr<detail::ReplyReader> reader_;
  std::string endpoint_;
  std::string out_;                      // formatted commands not yet sent
  std::vector<std::size_t> boundaries_;  // end offset of each queued command in out_
  std::size_t pending_ = 0;              // commands queued or sent whose replies are unread
  bool broken_ = false;
  std::size_t min_replicas_ = 0;                     // RedisOptions::min_replicas
  std::chrono::milliseconds replica_timeout_{};      // RedisOptions::replica_timeout
  bool wait_queued_ = false;                         // the last queued or sent command is that WAIT
  std::unique_ptr<detail::ClusterRouting> routing_;  // set on a cluster; then nothing above is
  // With Sentinel: the group that named this connection's server, and its epoch then.
  std::shared_ptr<detail::SentinelGroup> sentinel_;
  std::uint64_t epoch_ = 0;
};

class ConnectionPool;

// A connection borrowed from a pool; gives it back (or drops it when broken) on destruction.
// Move-only.
class ConnectionLease {
 public:
  ConnectionLease(ConnectionLease&& other) noexcept;
  ConnectionLease& operator=(ConnectionLease&& other) noexcept;
  ConnectionLease(const ConnectionLease&) = delete;
  ConnectionLease& operator=(const ConnectionLease&) = delete;
  ~ConnectionLease();

  RedisConnection& operator*() const noexcept { return *connection_; }
  RedisConnection* operator->() const noexcept { return connection_.get(); }

 private:
  friend class ConnectionPool;
  ConnectionLease(ConnectionPool* pool, std::unique_ptr<RedisConnection> connection) noexcept;
  void give_back() noexcept;

  ConnectionPool* pool_ = nullptr;
  std::unique_ptr<RedisConnection> connection_;
};

// Counters of one pool, for tests and monitoring.
struct PoolStats {
  std::size_t open = 0;                // connections that exist now (idle + leased + connecting)
  std::size_t idle = 0;                // connections waiting in the pool
  std::uint64_t connects = 0;          // connections opened successfully since the pool was made
  std::uint64_t connect_failures = 0;  // attempts that failed (server down, refused, auth)
  std::uint64_t dropped = 0;           // connections closed because they broke or were found dead
};

class ConnectionPool {
 public:
  // Validates the options and builds the TLS context (ConfigError); opens nothing yet.
  explicit ConnectionPool(RedisOptions options);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // An idle connection, or a new one when fewer than pool_size exist, or the first one given
  // back within wait_timeout. Throws RedisError: connect (retryable; the server is down or
  // refuses), tls (the handshake failed), auth (AUTH/SELECT refused), pool_exhausted (retryable).
  ConnectionLease lease();

  PoolStats stats() const;
  const RedisOptions& options() const noexcept { return options_; }

  // A new connection of this pool's kind (to the server, the cluster or the primary the
  // sentinels name) that is not counted in pool_size and never returns to the pool: for a
  // subscription, which must not share a connection with commands. Throws as lease() does.
  std::unique_ptr<RedisConnection> open_dedicated();

 private:
  friend class ConnectionLease;
  void give_back(std::unique_ptr<RedisConnection> connection) noexcept;

  const RedisOptions options_;
  const std::shared_ptr<const net::TlsContext> tls_;       // null without TLS
  const std::shared_ptr<detail::ClusterMap> cluster_;      // set on a cluster (cluster.hpp)
  const std::shared_ptr<detail::SentinelGroup> sentinel_;  // set with Sentinel (sentinel.hpp)
  const ::idem::detail::ForkOwner process_;                // lease() refuses a child of fork()
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
  std::size_t open_ = 0;
  PoolStats counters_;
};

}  // namespace idem::redis
