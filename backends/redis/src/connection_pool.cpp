#include "idem/redis/connection_pool.hpp"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "idem/error.hpp"
#include "idem/redis/redis_error.hpp"

namespace idem::redis {
namespace {

timeval to_timeval(std::chrono::milliseconds d) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(d.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((d.count() % 1000) * 1000);
  return tv;
}

RedisReply convert(const redisReply* raw) {
  RedisReply reply;
  switch (raw->type) {
    case REDIS_REPLY_STATUS:
      reply.type = RedisReply::Type::status;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_ERROR:
      reply.type = RedisReply::Type::error;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_STRING:
      reply.type = RedisReply::Type::string;
      reply.str.assign(raw->str, raw->len);
      break;
    case REDIS_REPLY_INTEGER:
      reply.type = RedisReply::Type::integer;
      reply.integer = raw->integer;
      break;
    case REDIS_REPLY_ARRAY:
      reply.type = RedisReply::Type::array;
      reply.elements.reserve(raw->elements);
      for (std::size_t i = 0; i < raw->elements; ++i)
        reply.elements.push_back(convert(raw->element[i]));
      break;
    default:  // REDIS_REPLY_NIL
      reply.type = RedisReply::Type::nil;
      break;
  }
  return reply;
}

void append_decimal(std::string& out, std::size_t value) {
  char buffer[24];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

bool is_timeout(int error_number) {
  return error_number == EAGAIN || error_number == EWOULDBLOCK || error_number == ETIMEDOUT;
}

}  // namespace

// ---- RedisConnection ------------------------------------------------------------------------

RedisConnection::RedisConnection(const RedisOptions& options) : endpoint_(options.endpoint()) {
  errno = 0;
  context_ = redisConnectWithTimeout(options.host.c_str(), options.port,
                                     to_timeval(options.connect_timeout));
  if (context_ == nullptr) {
    throw RedisError(RedisFailure::connect,
                     "idem redis: connect to " + endpoint_ + ": cannot allocate a connection",
                     /*retryable=*/true, /*in_doubt=*/false);
  }
  try {
    if (context_->err != 0) {
      const int error_number = errno;
      const std::string detail = context_->errstr;
      const bool timed_out =
          is_timeout(error_number) || detail.find("timed out") != std::string::npos;
      std::string message = "idem redis: connect to " + endpoint_ + ": " + detail;
      if (timed_out) {
        message += " (no answer within connect_timeout " +
                   std::to_string(options.connect_timeout.count()) + " ms)";
      }
      throw RedisError(RedisFailure::connect, message, /*retryable=*/true, /*in_doubt=*/false,
                       timed_out);
    }
    if (redisSetTimeout(context_, to_timeval(options.command_timeout)) != REDIS_OK) {
      throw RedisError(RedisFailure::connect,
                       "idem redis: connect to " + endpoint_ + ": " + context_->errstr,
                       /*retryable=*/true, /*in_doubt=*/false);
    }
    (void)redisEnableKeepAlive(context_);  // only helps notice dead peers; not essential
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
  } catch (...) {
    redisFree(context_);
    context_ = nullptr;
    throw;
  }
}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) redisFree(context_);
}

void RedisConnection::append(std::span<const std::string_view> args) {
  out_ += '*';
  append_decimal(out_, args.size());
  out_ += "\r\n";
  for (std::string_view arg : args) {
    out_ += '$';
    append_decimal(out_, arg.size());
    out_ += "\r\n";
    out_.append(arg);
    out_ += "\r\n";
  }
  boundaries_.push_back(out_.size());
  ++pending_;
}

void RedisConnection::append(std::initializer_list<std::string_view> args) {
  append(std::span<const std::string_view>(args.begin(), args.size()));
}

RedisReply RedisConnection::command(std::span<const std::string_view> args, CommandKind kind,
                                    std::string_view what) {
  if (pending_ != 0) {
    // The reply read next would belong to a queued command, not to this one.
    throw InvalidArgument("idem redis: command() with " + std::to_string(pending_) +
                          " pipelined commands still queued; call read_replies() first");
  }
  append(args);
  send_pending(kind, what);
  return read_one(kind, what, /*any_sent=*/true);
}

RedisReply RedisConnection::command(std::initializer_list<std::string_view> args, CommandKind kind,
                                    std::string_view what) {
  return command(std::span<const std::string_view>(args.begin(), args.size()), kind, what);
}

std::vector<RedisReply> RedisConnection::read_replies(CommandKind kind, std::string_view what) {
  send_pending(kind, what);
  std::vector<RedisReply> replies;
  replies.reserve(pending_);
  while (pending_ > 0)
    replies.push_back(read_one(kind, what, /*any_sent=*/true));
  return replies;
}

void RedisConnection::send_pending(CommandKind kind, std::string_view what) {
  if (broken_) {
    throw RedisError(
        RedisFailure::io,
        "idem redis: " + std::string(what) + " on " + endpoint_ + ": the connection is broken",
        /*retryable=*/true, /*in_doubt=*/false);
  }
  std::size_t sent = 0;
  while (sent < out_.size()) {
    // MSG_NOSIGNAL: a server that went away gives EPIPE here, never a SIGPIPE that would kill
    // the process (hiredis's own write() would).
    const ssize_t n = ::send(context_->fd, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      // A command whose every byte reached the kernel may have run; a cut-off one cannot.
      const bool whole_command_sent = !boundaries_.empty() && boundaries_.front() <= sent;
      fail_io(what, error_number, whole_command_sent, kind, std::strerror(error_number));
    }
    sent += static_cast<std::size_t>(n);
  }
  out_.clear();
  boundaries_.clear();
}

RedisReply RedisConnection::read_one(CommandKind kind, std::string_view what, bool any_sent) {
  void* raw = nullptr;
  errno = 0;
  if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
    const int error_number = errno;
    fail_io(what, error_number, any_sent, kind,
            context_->errstr[0] != '\0' ? context_->errstr : "no reply");
  }
  RedisReply reply = convert(static_cast<const redisReply*>(raw));
  freeReplyObject(raw);
  --pending_;
  return reply;
}

void RedisConnection::fail_io(std::string_view what, int error_number, bool sent, CommandKind kind,
                              const std::string& detail) {
  broken_ = true;
  const bool protocol = context_->err == REDIS_ERR_PROTOCOL;
  const bool timed_out = is_timeout(error_number);
  const bool in_doubt = sent && kind != CommandKind::read;
  const bool retryable = !in_doubt || kind == CommandKind::idempotent_write;
  std::string message = "idem redis: " + std::string(what) + " on " + endpoint_ + ": " + detail;
  if (timed_out) message += " (timed out: no answer within command_timeout)";
  if (context_->err == REDIS_ERR_EOF) message += " (the server closed the connection)";
  if (in_doubt) {
    message += "; the command was sent and its reply lost: it may or may not have been applied";
  }
  throw RedisError(protocol ? RedisFailure::protocol : RedisFailure::io, message, retryable,
                   in_doubt, timed_out);
}

bool RedisConnection::looks_dead() const noexcept {
  if (broken_ || context_ == nullptr || context_->err != 0) return true;
  // An idle connection has nothing to read. Readable means EOF (the server closed it, e.g. on
  // restart), a reset, or stray bytes — none of which a fresh command should meet.
  pollfd p{};
  p.fd = context_->fd;
  p.events = POLLIN | POLLRDHUP;
  const int ready = ::poll(&p, 1, 0);
  if (ready < 0) return errno != EINTR;
  return ready > 0;
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

ConnectionPool::ConnectionPool(RedisOptions options) : options_(validated(std::move(options))) {}

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
      if (!connection->looks_dead()) return ConnectionLease(this, std::move(connection));
      --open_;
      ++counters_.dropped;
      dead.push_back(std::move(connection));
    }
    if (open_ < options_.pool_size) {
      ++open_;  // reserve the slot, then connect without holding the lock
      lock.unlock();
      dead.clear();
      try {
        std::unique_ptr<RedisConnection> connection(new RedisConnection(options_));
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
  if (connection->broken() || connection->pending() != 0) {
    // Broken, or abandoned halfway through a pipeline (its replies would be read by the next
    // user): close it.
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

PoolStats ConnectionPool::stats() const {
  std::lock_guard lock(mutex_);
  PoolStats stats = counters_;
  stats.open = open_;
  stats.idle = idle_.size();
  return stats;
}

}  // namespace idem::redis
