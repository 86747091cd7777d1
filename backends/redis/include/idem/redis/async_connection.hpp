// AsyncConnection: one pipelined Redis connection that any number of coroutines share.
//
// Every call queues its command(s) and waits; one writer flushes everything queued in one write
// (a batch), and one reader feeds the replies to hiredis's RESP reader and hands them to the
// waiting calls in order (replies come back in the order the commands were written). So 1000
// concurrent calls on one connection cost a handful of system calls, not 1000 round trips. A
// call's commands are written contiguously: a pipeline() of n commands is n replies in a row.
//
// The connection opens on first use (TCP connect and, with RedisOptions::tls, the TLS handshake
// within RedisOptions::connect_timeout, then AUTH and SELECT before any caller's command is
// written). A TLS failure — an untrusted, expired or misnamed certificate, a refused client
// certificate, a plaintext port — fails the calls waiting with a non-retryable RedisError
// (RedisFailure::tls); naming a plaintext/TLS mismatch takes one blocking probe of the port (at
// most 1 s, on that failure path only). When it drops — reset, EOF, a reply that
// is not RESP, or command_timeout passing without a reply to the oldest written command — every
// call whose command was written fails with a RedisError classified as the blocking face does
// (redis_error.hpp: io/protocol, timed_out; in doubt for writes, retryable for reads and
// idempotent writes); calls not yet written wait for the next connection. Reconnecting is on
// demand: the first attempt after a drop is immediate. A failed attempt fails the calls waiting
// for it with a retryable connect error, and the next attempt (for calls made after it) waits a
// backoff first (50 ms doubling up to 1 s, reset by a success). An idle connection the server
// closed is noticed before writing and replaced without failing anyone.
//
// Cancellation (the awaiting coroutine's cancellation slot, e.g. a per-attempt timeout; the
// types are Asio's, asio::cancellation_type):
//  * before its command is written, the call is withdrawn, whatever the type: nothing reaches
//    the server and the call ends with asio::system_error(operation_aborted);
//  * after it is written, its reply is still read and dropped (the pipeline stays in sync). A
//    read ends at once with operation_aborted, whatever the type. A write may or may not have
//    run: a terminal or partial cancellation ends it at once with a RedisError (io) with
//    in_doubt(), retryable for an idempotent write, exactly like a lost reply — find out
//    (lookup, the lease) before acting on it again; a total cancellation (no side effects
//    allowed) cannot be honoured any more, and the call ends with its real outcome.
//
// Executors: the connection does its I/O on a strand of the executor it was made with
// (get_executor()); a call may come from any executor and resumes on its own (never on the
// connection's strand).
// Destroying the connection fails the calls still waiting with operation_aborted and closes the
// socket once no I/O is pending (work in flight keeps its state alive, never the owner).
// Destroying (or shutting down) the execution context of `executor` with calls still waiting
// destroys those calls without completing them — Asio's rule for the handlers pending on a
// context that goes: a coroutine waiting on a call is destroyed, never resumed — and closes the
// socket, so the state and whatever the waiting coroutines own (the recorder, the pool) are
// freed. A command already written may or may not have been applied (nobody hears which).
//
// With a redis+cluster:// URL (RedisOptions::cluster_nodes) the connection is a router instead:
// one such pipelined connection per primary of the cluster, opened on first use; each call's
// commands are split by their key's slot and sent to their primaries, MOVED, ASK, TRYAGAIN and
// CLUSTERDOWN are followed within command_timeout, and the replies come back in order (see
// docs/redis.md, "Redis Cluster"). With redis+sentinel:// each new socket asks a sentinel for the
// primary first (docs/redis.md, "Redis Sentinel").
//
// Thread safety: every member may be called from any thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <asio/any_io_executor.hpp>

#include "idem/async/task.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::net {
class TlsContext;
}

namespace idem::redis::detail {
class AsyncCluster;
}

namespace idem::redis {

// Commands written together, in order (one call of AsyncConnection::pipeline).
class CommandBatch {
 public:
  void add(std::span<const std::string_view> args);
  void add(std::initializer_list<std::string_view> args) {
    add(std::span<const std::string_view>(args.begin(), args.size()));
  }
  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  // The RESP bytes of every command added.
  const std::string& bytes() const noexcept { return bytes_; }
  std::string take_bytes() noexcept { return std::move(bytes_); }

 private:
  std::string bytes_;
  std::size_t count_ = 0;
};

// Counters of one connection (for tests and monitoring).
struct AsyncConnectionStats {
  std::uint64_t connects = 0;          // connections established (AUTH/SELECT done)
  std::uint64_t connect_failures = 0;  // attempts that failed
  std::uint64_t drops = 0;             // established connections lost
  std::uint64_t commands = 0;          // commands written
  std::uint64_t writes = 0;            // batches flushed: commands / writes is the batching
  std::uint64_t cancelled = 0;         // calls withdrawn or abandoned by cancellation
};

class AsyncConnection {
 public:
  using executor_type = asio::any_io_executor;

  // Validates the options and builds the TLS context (ConfigError); opens nothing yet.
  // `executor`'s strand runs the I/O.
  AsyncConnection(asio::any_io_executor executor, RedisOptions options);
  // The same, sharing `tls` (AsyncConnectionPool's one context; null: built from the options).
  AsyncConnection(asio::any_io_executor executor, RedisOptions options,
                  std::shared_ptr<const net::TlsContext> tls);
  ~AsyncConnection();
  AsyncConnection(const AsyncConnection&) = delete;
  AsyncConnection& operator=(const AsyncConnection&) = delete;

  // One command and its reply. An error reply (-ERR ...) is returned, not thrown; a failure of
  // the connection throws RedisError (see above). `what` names the operation in messages;
  // `kind` classifies a lost reply. The arguments are encoded (and `what` copied) when the call
  // is made, before the awaitable starts: they need not outlive it (co_spawn(io, c.command({..}))
  // is fine). The awaitable may outlive the connection (it then ends with operation_aborted).
  async::Task<RedisReply> command(std::span<const std::string_view> args,
                                  CommandKind kind = CommandKind::write,
                                  std::string_view what = "command");
  async::Task<RedisReply> command(std::initializer_list<std::string_view> args,
                                  CommandKind kind = CommandKind::write,
                                  std::string_view what = "command");
  // Every command of `batch`, written together; the replies in order. An empty batch returns
  // no replies without touching the connection.
  async::Task<std::vector<RedisReply>> pipeline(CommandBatch batch,
                                                CommandKind kind = CommandKind::write,
                                                std::string_view what = "pipeline");

  // Pub/sub, on a connection made for it (not one that serves other calls, such as a pool's):
  // subscribe() sends SUBSCRIBE `channel` — SSUBSCRIBE on a cluster, to the primary that serves
  // the channel's slot, following MOVED and ASK — and returns its reply (an error reply, such as
  // an ACL without pub/sub, is returned). From then on the connection only listens.
  // next_message() waits for the next message: the reply as Redis pushes it
  // (["message", channel, payload]; "smessage" on a cluster; ["sunsubscribe", channel, n] when
  // the cluster moved the slot away and ended the subscription), or nullopt once `deadline`
  // passes. Messages that arrive while nobody waits are kept (the latest 64) for the next call.
  // When the connection drops, the subscription is gone: next_message() throws RedisError
  // (retryable) and nothing reconnects it. Cancelling next_message() loses no message. One
  // subscribe() per connection, one next_message() at a time; the connection must outlive both
  // (unlike command()).
  async::Task<RedisReply> subscribe(std::string_view channel);
  async::Task<std::optional<RedisReply>> next_message(
      std::chrono::steady_clock::time_point deadline);

  // The executor it was made with (its I/O runs on a strand of it).
  executor_type get_executor() const noexcept;
  AsyncConnectionStats stats() const;
  const RedisOptions& options() const noexcept;
  // "host:port/db", for messages.
  const std::string& endpoint() const noexcept;

  struct State;  // internal

 private:
  friend class detail::AsyncCluster;
  // SUBSCRIBE or SSUBSCRIBE (`command`) on this connection's own socket.
  async::Task<RedisReply> send_subscribe(std::string_view command, std::string_view channel);

  static async::Task<RedisReply> one(std::shared_ptr<State> state, CommandBatch batch,
                                     CommandKind kind, std::string what);
  static async::Task<std::vector<RedisReply>> many(std::shared_ptr<State> state, CommandBatch batch,
                                                   CommandKind kind, std::string what);

  std::shared_ptr<State> state_;                      // one server (or the primary of a Sentinel)
  std::shared_ptr<detail::AsyncCluster> cluster_;     // or a Redis Cluster's router
  std::shared_ptr<AsyncConnection> subscribed_node_;  // a cluster's: the node subscribe() chose
};

// A fixed set of AsyncConnections (RedisOptions::async_connections, default 1); each call goes
// to the next one in turn. Thread safety: every member may be called from any thread at once.
class AsyncConnectionPool {
 public:
  using executor_type = asio::any_io_executor;

  AsyncConnectionPool(asio::any_io_executor executor, RedisOptions options);
  AsyncConnectionPool(const AsyncConnectionPool&) = delete;
  AsyncConnectionPool& operator=(const AsyncConnectionPool&) = delete;

  // The executor it was made with.
  executor_type get_executor() const noexcept;
  AsyncConnection& next() noexcept;
  std::size_t size() const noexcept { return connections_.size(); }
  AsyncConnection& at(std::size_t i) { return *connections_.at(i); }
  const RedisOptions& options() const noexcept { return options_; }
  // The sum over every connection.
  AsyncConnectionStats stats() const;
  // A new connection with the pool's options, executor and TLS context, not in the pool: for
  // pub/sub (AsyncConnection::subscribe()), which takes a connection for itself.
  std::unique_ptr<AsyncConnection> open_dedicated() const;

 private:
  RedisOptions options_;
  std::shared_ptr<const net::TlsContext> tls_;
  std::vector<std::unique_ptr<AsyncConnection>> connections_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace idem::redis
