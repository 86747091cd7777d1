#include "idem/rabbitmq/publisher.hpp"

#include <chrono>
#include <mutex>

#include "amqp_connection.hpp"
#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "internal.hpp"

namespace idem::rabbitmq {

namespace detail {

void validate_connection_options(const ConnectionOptions& options) {
  const auto bad = [](const std::string& what) {
    throw ConfigError("idem rabbitmq: ConnectionOptions: " + what);
  };
  if (options.host.empty()) bad("host is empty");
  if (options.host.find('\0') != std::string::npos) bad("host contains a NUL byte");
  if (options.port < 1 || options.port > 65535)
    bad("port " + std::to_string(options.port) + " is not in 1..65535");
  if (options.vhost.empty()) bad("vhost is empty (the default vhost is \"/\")");
  if (options.heartbeat.count() < 0) bad("heartbeat is negative");
  if (options.heartbeat > std::chrono::hours(18)) bad("heartbeat is longer than 65535 s");
  if (options.connect_timeout.count() <= 0) bad("connect_timeout must be positive");
  if (options.initial_backoff.count() < 0) bad("initial_backoff is negative");
  if (options.max_backoff < options.initial_backoff)
    bad("max_backoff is shorter than initial_backoff");
  if (options.max_reconnect_attempts < 0) bad("max_reconnect_attempts is negative");
  options.validate();  // TLS files and secrets
}

void validate_amqp_name(std::string_view what, const std::string& name, bool allow_empty) {
  if (name.empty() && !allow_empty)
    throw ConfigError("idem rabbitmq: " + std::string(what) + " is empty");
  if (name.size() > 255)
    throw ConfigError("idem rabbitmq: " + std::string(what) + " is longer than 255 bytes");
  if (name.find('\0') != std::string::npos)
    throw ConfigError("idem rabbitmq: " + std::string(what) + " contains a NUL byte");
}

Outgoing to_outgoing(const Event& event) {
  validate_key("event id", event.id);
  if (event.type.empty()) throw InvalidArgument("idem rabbitmq: publish: the event type is empty");
  if (event.type.size() > 255) {
    throw InvalidArgument(
        "idem rabbitmq: publish: the event type is longer than 255 bytes (the AMQP routing key "
        "limit)");
  }
  for (const auto& [key, value] : event.headers) {
    if (key.empty() || key.size() > 255) {
      throw InvalidArgument("idem rabbitmq: publish: header names must be 1..255 bytes");
    }
  }
  Outgoing message;
  message.message_id = &event.id;
  message.type = &event.type;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(event.timestamp.time_since_epoch()).count();
  message.timestamp = seconds < 0 ? 0 : static_cast<std::uint64_t>(seconds);
  message.headers = event.headers;
  message.body = event.payload;
  return message;
}

bool wait_unless_stopped(Clock& clock, Millis duration, Millis slice,
                         const std::atomic<bool>& stop) {
  while (duration.count() > 0) {
    if (stop.load()) return false;
    const Millis step = std::min(duration, slice);
    clock.sleep_for(step);
    duration -= step;
  }
  return !stop.load();
}

}  // namespace detail

std::string_view to_string(ExchangeType type) noexcept {
  switch (type) {
    case ExchangeType::topic:
      return "topic";
    case ExchangeType::fanout:
      return "fanout";
  }
  return "topic";
}

namespace {

std::string batch_prefix(std::size_t index, std::size_t size) {
  return "idem rabbitmq: publish_batch: event " + std::to_string(index) + " of " +
         std::to_string(size) + " (nothing was sent): ";
}

}  // namespace

class Publisher::Impl {
 public:
  // ConfigError in a child of fork(): the connection is the parent's.
  void check_process() const { process_.use("this RabbitMQ publisher"); }

  Impl(ConnectionOptions connection, PublisherOptions options)
      : connection_options_(std::move(connection)), options_(std::move(options)) {
    detail::validate_connection_options(connection_options_);
    detail::validate_amqp_name("PublisherOptions::exchange", options_.exchange);
    std::lock_guard lock(mutex_);
    connect();
  }

  void publish(const Event& event) {
    const detail::Outgoing message = detail::to_outgoing(event);
    std::lock_guard lock(mutex_);
    try {
      if (connection_ == nullptr || !connection_->alive()) {
        connection_.reset();
        connect();
        ++stats_.reconnects;
      }
      connection_->publish(options_.exchange, event.type, message);
      ++stats_.published;
    } catch (...) {
      ++stats_.failed;
      if (connection_ != nullptr && connection_->broken()) connection_.reset();
      throw;
    }
  }

  std::size_t publish_batch(std::span<const Event> events) {
    std::vector<detail::Outgoing> messages;
    std::vector<const std::string*> keys;
    messages.reserve(events.size());
    keys.reserve(events.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
      try {
        messages.push_back(detail::to_outgoing(events[i]));
      } catch (const InvalidKey& error) {
        throw InvalidKey(batch_prefix(i, events.size()) + detail::bare_message(error));
      } catch (const InvalidArgument& error) {
        throw InvalidArgument(batch_prefix(i, events.size()) + detail::bare_message(error));
      }
      keys.push_back(&events[i].type);
    }
    if (events.empty()) return 0;
    std::lock_guard lock(mutex_);
    std::size_t confirmed = 0;
    try {
      if (connection_ == nullptr || !connection_->alive()) {
        connection_.reset();
        connect();
        ++stats_.reconnects;
      }
      connection_->publish_batch(options_.exchange, keys, messages, confirmed);
      stats_.published += events.size();
      return events.size();
    } catch (const BrokerError& error) {
      ++stats_.failed;
      if (connection_ != nullptr && connection_->broken()) connection_.reset();
      throw PublishBatchError(detail::bare_message(error), error.in_doubt(), confirmed);
    } catch (...) {
      ++stats_.failed;
      if (connection_ != nullptr && connection_->broken()) connection_.reset();
      throw;
    }
  }

  PublisherStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  void connect() {
    auto connection = std::make_unique<detail::AmqpConnection>(connection_options_);
    connection->declare_exchange(options_.exchange, to_string(options_.exchange_type));
    if (options_.confirms) connection->enable_confirms();
    connection_ = std::move(connection);
  }

  const ConnectionOptions connection_options_;
  const PublisherOptions options_;
  mutable std::mutex mutex_;
  std::unique_ptr<detail::AmqpConnection> connection_;
  PublisherStats stats_;
  const ::idem::detail::ForkOwner process_;
};

Publisher::Publisher(ConnectionOptions connection, PublisherOptions options)
    : impl_(std::make_unique<Impl>(std::move(connection), std::move(options))) {}
Publisher::~Publisher() = default;

void Publisher::publish(const Event& event) {
  impl_->check_process();
  impl_->publish(event);
}
std::size_t Publisher::publish_batch(std::span<const Event> events) {
  impl_->check_process();
  return impl_->publish_batch(events);
}
PublisherStats Publisher::stats() const {
  return impl_->stats();
}

}  // namespace idem::rabbitmq
