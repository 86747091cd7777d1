#include "sentinel.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <string_view>
#include <utility>

#include "idem/net/stream.hpp"
#include "idem/redis/redis_error.hpp"
#include "internal.hpp"
#include "resp.hpp"

namespace idem::redis::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How long connect() waits before asking the sentinels again when the primary they name is
// unreachable or still a replica (a failover in progress).
constexpr std::chrono::milliseconds kRetryPause{100};
// How long the watch waits before subscribing again after losing its sentinel.
constexpr int kWatchReconnectMs = 500;

RedisOptions sentinel_connection_options(const RedisOptions& options) {
  RedisOptions out = options;
  out.sentinel_nodes.clear();
  out.sentinel_master.clear();
  out.db = 0;  // a sentinel has no databases
  out.username = options.sentinel_username;
  out.password = options.sentinel_password;
  out.min_replicas = 0;  // nothing idem sends a sentinel writes
  return out;
}

std::string node_name(const RedisNode& node) {
  const bool ipv6 = node.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + node.host + "]" : node.host) + ":" + std::to_string(node.port);
}

}  // namespace

SentinelGroup::SentinelGroup(const RedisOptions& options,
                             std::shared_ptr<const net::TlsContext> tls)
    : options_(options),
      sentinel_options_(sentinel_connection_options(options)),
      tls_(std::move(tls)) {}

SentinelGroup::~SentinelGroup() {
  if (watch_.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof one);
    watch_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

std::unique_ptr<RedisConnection> SentinelGroup::open_sentinel(std::size_t index) const {
  RedisOptions options = sentinel_options_;
  options.host = options_.sentinel_nodes[index].host;
  options.port = options_.sentinel_nodes[index].port;
  return std::unique_ptr<RedisConnection>(new RedisConnection(options, tls_));
}

SentinelGroup::Answer SentinelGroup::ask(std::size_t index) const {
  Answer answer;
  const std::string name = node_name(options_.sentinel_nodes[index]);
  try {
    std::unique_ptr<RedisConnection> sentinel = open_sentinel(index);
    const RedisReply reply =
        sentinel->command({"SENTINEL", "get-master-addr-by-name", options_.sentinel_master},
                          CommandKind::read, "SENTINEL get-master-addr-by-name");
    if (reply.type == RedisReply::Type::nil) {
      answer.kind = Answer::Kind::unknown_name;
      answer.detail =
          "sentinel " + name + " monitors no primary named '" + options_.sentinel_master + "'";
      return answer;
    }
    if (reply.is_error()) {
      answer.detail = "sentinel " + name + " answered " + reply.str;
      return answer;
    }
    int port = 0;
    const bool shaped = reply.type == RedisReply::Type::array && reply.elements.size() == 2;
    if (shaped) {
      const std::string& text = reply.elements[1].str;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
      if (ec != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535)
        port = 0;
    }
    if (!shaped || port == 0 || reply.elements[0].str.empty()) {
      answer.detail =
          "sentinel " + name + " gave no address for '" + options_.sentinel_master + "'";
      return answer;
    }
    answer.kind = Answer::Kind::address;
    answer.primary = RedisNode{reply.elements[0].str, port};
  } catch (const RedisError& e) {
    if (e.failure() == RedisFailure::auth || e.failure() == RedisFailure::tls) throw;
    answer.detail = e.what();
  }
  return answer;
}

std::unique_ptr<RedisConnection> SentinelGroup::connect() {
  std::call_once(watch_started_, [this] { start_watch(); });
  const auto deadline = Clock::now() + options_.connect_timeout;
  const std::size_t count = options_.sentinel_nodes.size();
  for (;;) {
    const std::uint64_t epoch_now = epoch();
    std::string problem;
    std::size_t unknown = 0;
    const std::size_t first = preferred_.load(std::memory_order_relaxed) % count;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t index = (first + i) % count;
      Answer answer = ask(index);
      if (answer.kind == Answer::Kind::unknown_name) ++unknown;
      if (answer.kind != Answer::Kind::address) {
        problem += (problem.empty() ? "" : "; ") + answer.detail;
        continue;
      }
      preferred_.store(index, std::memory_order_relaxed);
      RedisOptions primary = options_;
      primary.sentinel_nodes.clear();
      primary.sentinel_master.clear();
      primary.host = answer.primary.host;
      primary.port = answer.primary.port;
      try {
        std::unique_ptr<RedisConnection> connection(new RedisConnection(primary, tls_));
        const RedisReply role = connection->command({"ROLE"}, CommandKind::read, "ROLE");
        const bool is_primary = role.type == RedisReply::Type::array && !role.elements.empty() &&
                                role.elements[0].str == "master";
        if (is_primary) {
          connection->sentinel_ = shared_from_this();
          connection->epoch_ = epoch_now;
          return connection;
        }
        problem = "the sentinels name " + node_name(answer.primary) + " as primary of '" +
                  options_.sentinel_master + "', but it answers ROLE " +
                  (role.is_error()         ? role.str
                   : role.elements.empty() ? std::string("(empty)")
                                           : role.elements[0].str) +
                  " (a failover in progress?)";
      } catch (const RedisError& e) {
        if (!e.retryable()) throw;
        problem = "the primary of '" + options_.sentinel_master +
                  "' that the sentinels name: " + e.what();
      }
      break;  // ask again after a pause: the sentinels have not caught up yet
    }
    if (unknown == count) {
      // Every sentinel answered, and none monitors this name: a configuration mistake, not an
      // outage.
      throw RedisError(
          RedisFailure::connect,
          "idem redis: no sentinel of " + options_.endpoint() + " monitors a primary named '" +
              options_.sentinel_master + "' (check the name after the hosts in the URL)",
          /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false, ErrorCode::config_error);
    }
    if (Clock::now() + kRetryPause >= deadline) {
      throw RedisError(RedisFailure::connect,
                       "idem redis: connect to " + options_.endpoint() + ": " + problem +
                           " (still so after connect_timeout " +
                           std::to_string(options_.connect_timeout.count()) + " ms)",
                       /*retryable=*/true, /*in_doubt=*/false, /*timed_out=*/false,
                       ErrorCode::connect_timeout);
    }
    std::this_thread::sleep_for(kRetryPause);
  }
}

// ---- the +switch-master watch ---------------------------------------------------------------

void SentinelGroup::start_watch() {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return;  // no watch: -READONLY and dropped connections still move the pool
  watch_ = std::thread([this] { watch(); });
}

bool SentinelGroup::stop_requested_within(int ms) const {
  pollfd fd{stop_fd_, POLLIN, 0};
  return ::poll(&fd, 1, ms) > 0;
}

void SentinelGroup::watch() {
  const std::size_t count = options_.sentinel_nodes.size();
  std::size_t index = preferred_.load(std::memory_order_relaxed) % count;
  bool subscribed_before = false;
  char buffer[4096];
  for (;;) {
    std::unique_ptr<RedisConnection> sentinel;
    try {
      sentinel = open_sentinel(index);
      const RedisReply reply =
          sentinel->command({"SUBSCRIBE", "+switch-master"}, CommandKind::read, "SUBSCRIBE");
      if (reply.is_error()) sentinel.reset();
    } catch (const std::exception&) {
      sentinel.reset();
    }
    if (sentinel) {
      // A switch may have happened while no sentinel was watched: start over from the sentinels.
      if (subscribed_before) primary_changed();
      subscribed_before = true;
      net::Stream& stream = *sentinel->stream_;
      for (;;) {
        std::optional<RedisReply> message;
        try {
          message = sentinel->reader_->next();
        } catch (const std::exception&) {
          break;
        }
        if (message) {
          // ["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"]
          if (message->type == RedisReply::Type::array && message->elements.size() == 3 &&
              message->elements[0].str == "message") {
            const std::string& text = message->elements[2].str;
            const std::string_view name = std::string_view(text).substr(0, text.find(' '));
            if (name == options_.sentinel_master) primary_changed();
          }
          continue;
        }
        if (stream.buffered() == 0) {
          pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {stream.fd(), POLLIN, 0}};
          if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
          }
          if (fds[0].revents != 0) return;
        }
        std::size_t n = 0;
        try {
          n = net::read_some_blocking(stream, buffer, Clock::now() + options_.command_timeout);
        } catch (const std::exception&) {
          break;
        }
        if (n == 0) break;  // the sentinel closed the connection
        try {
          sentinel->reader_->feed(buffer, n);
        } catch (const std::exception&) {
          break;
        }
      }
    }
    index = (index + 1) % count;
    if (stop_requested_within(kWatchReconnectMs)) return;
  }
}

}  // namespace idem::redis::detail
