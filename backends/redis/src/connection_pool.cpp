#include "idem/redis/connection_pool.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "cluster.hpp"
#include "idem/error.hpp"
#include "idem/net/stream.hpp"
#include "idem/net/tls.hpp"
#include "idem/redis/redis_error.hpp"
#include "internal.hpp"
#include "resp.hpp"
#include "sentinel.hpp"
#include "tls_support.hpp"

namespace idem::redis {
namespace {

bool is_timeout(int error_number) {
  return error_number == EAGAIN || error_number == EWOULDBLOCK || error_number == ETIMEDOUT;
}

std::chrono::steady_clock::time_point after(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

}  // namespace

// ---- RedisConnection ------------------------------------------------------------------------

RedisConnection::RedisConnection(const RedisOptions& options,
                                 std::shared_ptr<const net::TlsContext> tls)
    : command_timeout_(options.command_timeout),
      connect_timeout_(options.connect_timeout),
      tls_(tls),
      host_(options.host),
      reader_(std::make_unique<detail::ReplyReader>()),
      endpoint_(options.endpoint()),
      min_replicas_(options.min_replicas),
      replica_timeout_(options.replica_timeout) {
  try {
    addresses_ = net::resolve(options.host, options.port);
  } catch (const net::ResolveError& e) {
    throw detail::resolve_error(endpoint_, e.what(), e.temporary());
  }
  const auto deadline = after(options.connect_timeout);  // TCP and the TLS handshake
  bool handshaking = false;
  try {
    stream_ = std::make_unique<net::Stream>(net::connect(addresses_, deadline));
    if (tls) {
      handshaking = true;
      stream_->start_tls(tls, options.host);
      net::handshake(*stream_, deadline);
    }
  } catch (const net::TlsError& e) {
    throw detail::tls_error(endpoint_, e.what());
  } catch (const std::system_error& e) {
    const bool timed_out = is_timeout(e.code().value());
    if (handshaking && timed_out) {
      const std::string cause = detail::tls_to_plaintext_port(addresses_, options.connect_timeout);
      if (!cause.empty()) throw detail::tls_error(endpoint_, cause);
    }
    std::string detail = (handshaking ? "TLS handshake: " : "") + e.code().message();
    if (timed_out) {
      detail += " (no answer within connect_timeout " +
                std::to_string(options.connect_timeout.count()) + " ms)";
    }
    throw detail::connect_error(endpoint_, e.code().value(), detail);
  }
  if (options.password) {
    RedisReply reply =
        options.username
            ? command({"AUTH", *options.username, *options.password}, CommandKind::read, "AUTH")
            : command({"AUTH", *options.password}, CommandKind::read, "AUTH");
    if (reply.is_error()) {
      throw RedisError(RedisFailure::auth,
                       "idem redis: AUTH on " + endpoint_ + " refused: " + reply.str,
                       /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false,
                       ErrorCode::store_open_failed);
    }
  }
  if (options.db != 0) {
    const std::string db = std::to_string(options.db);
    RedisReply reply = command({"SELECT", db}, CommandKind::read, "SELECT");
    if (reply.is_error()) {
      throw RedisError(RedisFailure::auth,
                       "idem redis: SELECT " + db + " on " + endpoint_ + " refused: " + reply.str,
                       /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false,
                       ErrorCode::store_open_failed);
    }
  }
}

RedisConnection::RedisConnection(std::shared_ptr<detail::ClusterMap> cluster)
    : command_timeout_(cluster->options().command_timeout),
      connect_timeout_(cluster->options().connect_timeout),
      endpoint_(cluster->options().endpoint()),
      routing_(std::make_unique<detail::ClusterRouting>(std::move(cluster))) {}

RedisConnection::~RedisConnection() = default;

std::size_t RedisConnection::pending() const noexcept {
  return routing_ ? routing_->pending() : pending_;
}

bool RedisConnection::broken() const noexcept {
  return routing_ ? routing_->broken() : broken_;
}

const std::string& RedisConnection::endpoint() const noexcept {
  if (routing_ && !routing_->endpoint().empty()) return routing_->endpoint();
  return endpoint_;
}

void RedisConnection::append(std::span<const std::string_view> args) {
  if (routing_) return routing_->append(args);
  detail::append_command(out_, args);
  boundaries_.push_back(out_.size());
  ++pending_;
}

void RedisConnection::append(std::initializer_list<std::string_view> args) {
  append(std::span<const std::string_view>(args.begin(), args.size()));
}

RedisReply RedisConnection::command(std::span<const std::string_view> args, CommandKind kind,
                                    std::string_view what) {
  if (routing_) return routing_->command(args, kind, what);
  if (pending_ != 0) {
    // The reply read next would belong to a queued command, not to this one.
    throw InvalidArgument("idem redis: command() with " + std::to_string(pending_) +
                          " pipelined commands still queued; call read_replies() first");
  }
  append(args);
  send_pending(kind, what);
  RedisReply reply = read_one(kind, what, /*any_sent=*/true);
  if (wait_queued_) check_wait(read_one(kind, what, true), reply.is_error(), kind, what);
  return reply;
}

RedisReply RedisConnection::command(std::initializer_list<std::string_view> args, CommandKind kind,
                                    std::string_view what) {
  return command(std::span<const std::string_view>(args.begin(), args.size()), kind, what);
}

std::vector<RedisReply> RedisConnection::read_replies(CommandKind kind, std::string_view what) {
  if (routing_) return routing_->read_replies(kind, what);
  send_pending(kind, what);
  std::vector<RedisReply> replies;
  replies.reserve(pending_);
  while (pending_ > 0)
    replies.push_back(read_one(kind, what, /*any_sent=*/true));
  if (wait_queued_ && !replies.empty()) {
    const RedisReply wait = std::move(replies.back());
    replies.pop_back();
    const bool no_write = std::all_of(replies.begin(), replies.end(),
                                      [](const RedisReply& r) { return r.is_error(); });
    check_wait(wait, no_write, kind, what);
  }
  return replies;
}

void RedisConnection::check_wait(const RedisReply& wait, bool no_write, CommandKind kind,
                                 std::string_view what) {
  wait_queued_ = false;
  detail::check_wait(wait, min_replicas_, replica_timeout_, no_write, kind, what, endpoint_);
}

void RedisConnection::send_pending(CommandKind kind, std::string_view what) {
  if (broken_) {
    throw RedisError(
        RedisFailure::io,
        "idem redis: " + std::string(what) + " on " + endpoint_ + ": the connection is broken",
        /*retryable=*/true, /*in_doubt=*/false);
  }
  if (min_replicas_ > 0 && kind != CommandKind::read && pending_ > 0 && !wait_queued_) {
    // Durability: the replicas must confirm these writes before they count as done.
    const std::string replicas = std::to_string(min_replicas_);
    const std::string timeout = std::to_string(replica_timeout_.count());
    append({"WAIT", replicas, timeout});
    wait_queued_ = true;
  }
  std::size_t sent = 0;
  try {
    net::write_all(*stream_, out_, after(command_timeout_), sent);
  } catch (const net::TlsError& e) {
    broken_ = true;
    if (e.setup()) throw detail::tls_error(endpoint_, e.what());
    const bool whole_command_sent = !boundaries_.empty() && boundaries_.front() <= sent;
    fail_io(what, 0, whole_command_sent, kind, e.what());
  } catch (const std::system_error& e) {
    const std::string cause = tls_mismatch(e.code().value(), false);
    if (!cause.empty()) throw detail::tls_error(endpoint_, cause);
    // A command whose every byte reached the kernel may have run; a cut-off one cannot.
    const bool whole_command_sent = !boundaries_.empty() && boundaries_.front() <= sent;
    fail_io(what, e.code().value(), whole_command_sent, kind, e.code().message());
  }
  out_.clear();
  boundaries_.clear();
}

RedisReply RedisConnection::read_one(CommandKind kind, std::string_view what, bool any_sent) {
  const auto deadline = after(command_timeout_);
  char buffer[16 * 1024];
  for (;;) {
    try {
      if (auto reply = reader_->next()) {
        replied_ = true;
        --pending_;
        // A replica (the demoted primary, after a failover) refuses writes: with Sentinel, every
        // connection to it is outdated.
        if (sentinel_ && reply->is_error() && reply->str.rfind("READONLY", 0) == 0)
          sentinel_->primary_demoted(epoch_);
        return std::move(*reply);
      }
    } catch (const detail::ProtocolError& e) {
      if (!replied_) not_redis(what);
      fail_io(what, 0, any_sent, kind, std::string("protocol error: ") + e.what(),
              /*protocol=*/true);
    }
    std::size_t n = 0;
    try {
      n = net::read_some_blocking(*stream_, buffer, deadline);
    } catch (const net::TlsError& e) {
      broken_ = true;
      // Under TLS 1.3 the server's verdict on the client certificate arrives with the first read.
      if (e.setup()) throw detail::tls_error(endpoint_, e.what());
      fail_io(what, 0, any_sent, kind, e.what());
    } catch (const std::system_error& e) {
      const std::string cause = tls_mismatch(e.code().value(), false);
      if (!cause.empty()) throw detail::tls_error(endpoint_, cause);
      fail_io(what, e.code().value(), any_sent, kind, e.code().message());
    }
    if (n == 0) {
      const std::string cause = tls_mismatch(0, true);
      if (!cause.empty()) throw detail::tls_error(endpoint_, cause);
      fail_io(what, 0, any_sent, kind, "Server closed the connection", false, /*eof=*/true);
    }
    if (!received_ && !tls_ && net::looks_like_tls_record(std::span<const char>(buffer, n))) {
      broken_ = true;
      throw detail::tls_error(endpoint_, detail::tls_record_on_plaintext());
    }
    if (!received_) first_bytes_.assign(buffer, std::min<std::size_t>(n, 16));
    received_ = true;
    try {
      reader_->feed(buffer, n);
    } catch (const detail::ProtocolError& e) {
      if (!replied_) not_redis(what);
      fail_io(what, 0, any_sent, kind, std::string("protocol error: ") + e.what(),
              /*protocol=*/true);
    }
  }
}

void RedisConnection::fail_io(std::string_view what, int error_number, bool sent, CommandKind kind,
                              const std::string& detail, bool protocol, bool eof) {
  broken_ = true;
  const bool timed_out = is_timeout(error_number);
  const bool in_doubt = sent && kind != CommandKind::read;
  const bool retryable = !in_doubt || kind == CommandKind::idempotent_write;
  std::string message = "idem redis: " + std::string(what) + " on " + endpoint_ + ": " + detail;
  if (timed_out) message += " (timed out: no answer within command_timeout)";
  if (eof) message += " (the server closed the connection)";
  if (in_doubt) {
    message += "; the command was sent and its reply lost: it may or may not have been applied";
  }
  // A server that never answered on this connection: the address may not be a Redis port.
  const bool silent = timed_out && !replied_;
  if (silent) message += " (no reply yet on this connection: is this a Redis port?)";
  throw RedisError(protocol ? RedisFailure::protocol : RedisFailure::io, message, retryable,
                   in_doubt, timed_out,
                   silent ? ErrorCode::connect_timeout : ErrorCode::store_error);
}

void RedisConnection::not_redis(std::string_view what) {
  broken_ = true;
  throw detail::not_redis_error(what, endpoint_, first_bytes_);
}

std::optional<RedisReply> RedisConnection::next_push(
    std::chrono::steady_clock::time_point deadline) {
  if (routing_) {
    RedisConnection* node = routing_->last_node();
    if (node == nullptr) {
      throw RedisError(RedisFailure::io,
                       "idem redis: wait on " + endpoint() + ": the subscription's node is gone",
                       /*retryable=*/true, /*in_doubt=*/false);
    }
    return node->next_push(deadline);
  }
  char buffer[4096];
  for (;;) {
    try {
      if (auto reply = reader_->next()) return reply;
    } catch (const detail::ProtocolError& e) {
      fail_io("wait", 0, false, CommandKind::read, std::string("protocol error: ") + e.what(),
              /*protocol=*/true);
    }
    if (stream_->buffered() == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return std::nullopt;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      pollfd fd{stream_->fd(), POLLIN, 0};
      const int ready =
          ::poll(&fd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready == 0) continue;
      if (ready < 0 && errno == EINTR) continue;
    }
    std::size_t n = 0;
    try {
      n = net::read_some_blocking(*stream_, buffer, after(command_timeout_));
    } catch (const std::system_error& e) {
      fail_io("wait", e.code().value(), false, CommandKind::read, e.code().message());
    }
    if (n == 0)
      fail_io("wait", 0, false, CommandKind::read, "Server closed the connection", false, true);
    try {
      reader_->feed(buffer, n);
    } catch (const detail::ProtocolError& e) {
      fail_io("wait", 0, false, CommandKind::read, std::string("protocol error: ") + e.what(),
              /*protocol=*/true);
    }
  }
}

bool RedisConnection::outdated() const noexcept {
  return sentinel_ && sentinel_->epoch() != epoch_;
}

bool RedisConnection::looks_dead() noexcept {
  if (routing_) return routing_->looks_dead();
  if (broken_ || !stream_ || !stream_->is_open()) return true;
  // An idle connection has nothing to read. Readable means EOF (the server closed it, e.g. on
  // restart), a reset, or stray bytes — none of which a fresh command should meet (TLS session
  // tickets are consumed by the stream and do not count).
  return stream_->idle_peer_gone();
}

std::string RedisConnection::tls_mismatch(int error_number, bool eof) {
  if (received_ || !(eof || error_number == ECONNRESET || error_number == EPIPE)) return {};
  broken_ = true;
  if (tls_) return detail::tls_session_refused(addresses_, tls_, host_, connect_timeout_);
  return detail::plaintext_to_tls_port(addresses_, connect_timeout_);
}

// ---- ConnectionLease ------------------------------------------------------------------------

ConnectionLease::ConnectionLease(ConnectionPool* pool,
                                 std::unique_ptr<RedisConnection> connection) noexcept
    : pool_(pool), connection_(std::move(connection)) {}

ConnectionLease::ConnectionLease(ConnectionLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), connection_(std::move(other.connection_)) {}

ConnectionLease& ConnectionLease::operator=(ConnectionLease&& other) noexcept {
  if (this != &other) {
    give_back();
    pool_ = std::exchange(other.pool_, nullptr);
    connection_ = std::move(other.connection_);
  }
  return *this;
}

ConnectionLease::~ConnectionLease() {
  give_back();
}

void ConnectionLease::give_back() noexcept {
  if (pool_ != nullptr && connection_) pool_->give_back(std::move(connection_));
  pool_ = nullptr;
}

// ---- ConnectionPool -------------------------------------------------------------------------

namespace {
RedisOptions validated(RedisOptions options) {
  options.validate();
  return options;
}
}  // namespace

ConnectionPool::ConnectionPool(RedisOptions options)
    : options_(validated(std::move(options))),
      tls_(detail::make_tls_context(options_)),
      cluster_(options_.is_cluster() ? std::make_shared<detail::ClusterMap>(options_, tls_)
                                     : nullptr),
      sentinel_(options_.is_sentinel() ? std::make_shared<detail::SentinelGroup>(options_, tls_)
                                       : nullptr) {}

ConnectionPool::~ConnectionPool() = default;

ConnectionLease ConnectionPool::lease() {
  process_.use("this Redis connection pool (of a recorder or store)");
  std::vector<std::unique_ptr<RedisConnection>> dead;  // closed after the lock is released
  std::unique_lock lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + options_.wait_timeout;
  for (;;) {
    while (!idle_.empty()) {
      std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
      idle_.pop_back();
      if (!connection->outdated() && !connection->looks_dead())
        return ConnectionLease(this, std::move(connection));
      --open_;
      ++counters_.dropped;
      dead.push_back(std::move(connection));
    }
    if (open_ < options_.pool_size) {
      ++open_;  // reserve the slot, then connect without holding the lock
      lock.unlock();
      dead.clear();
      try {
        std::unique_ptr<RedisConnection> connection =
            sentinel_  ? sentinel_->connect()
            : cluster_ ? std::unique_ptr<RedisConnection>(new RedisConnection(cluster_))
                       : std::unique_ptr<RedisConnection>(new RedisConnection(options_, tls_));
        lock.lock();
        ++counters_.connects;
        return ConnectionLease(this, std::move(connection));
      } catch (...) {
        lock.lock();
        --open_;
        ++counters_.connect_failures;
        returned_.notify_one();
        throw;
      }
    }
    const bool available = returned_.wait_until(
        lock, deadline, [&] { return !idle_.empty() || open_ < options_.pool_size; });
    if (!available) {
      throw RedisError(RedisFailure::pool_exhausted,
                       "idem redis: all " + std::to_string(options_.pool_size) +
                           " connections to " + options_.endpoint() + " stayed busy for " +
                           std::to_string(options_.wait_timeout.count()) +
                           " ms (wait_timeout); raise pool_size or wait_timeout",
                       /*retryable=*/true, /*in_doubt=*/false);
    }
  }
}

void ConnectionPool::give_back(std::unique_ptr<RedisConnection> connection) noexcept {
  std::unique_lock lock(mutex_);
  if (connection->broken() || connection->pending() != 0 || connection->outdated()) {
    // Broken, abandoned halfway through a pipeline (its replies would be read by the next
    // user), or open to a primary that has been replaced: close it.
    --open_;
    ++counters_.dropped;
    lock.unlock();
    returned_.notify_one();
    connection.reset();
    return;
  }
  idle_.push_back(std::move(connection));
  lock.unlock();
  returned_.notify_one();
}

std::unique_ptr<RedisConnection> ConnectionPool::open_dedicated() {
  process_.use("this Redis connection pool (of a recorder or store)");
  if (sentinel_) return sentinel_->connect();
  if (cluster_) return std::unique_ptr<RedisConnection>(new RedisConnection(cluster_));
  return std::unique_ptr<RedisConnection>(new RedisConnection(options_, tls_));
}

PoolStats ConnectionPool::stats() const {
  std::lock_guard lock(mutex_);
  PoolStats stats = counters_;
  stats.open = open_;
  stats.idle = idle_.size();
  return stats;
}

}  // namespace idem::redis
