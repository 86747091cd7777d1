// One rabbitmq-c connection with one channel, wrapped for idem (internal).
//
// Every failure becomes a BrokerError (broker_error.hpp) and leaves the connection broken():
// its owner drops it and opens a new one rather than trying to resynchronise a half-read
// protocol stream. Not thread-safe, like rabbitmq-c itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/options.hpp"

struct amqp_connection_state_t_;
struct amqp_message_t_;

namespace idem::rabbitmq::detail {

// What idem reads from a received message.
struct Delivery {
  std::uint64_t tag = 0;
  bool redelivered = false;
  std::string routing_key;
  std::string body;
  std::optional<std::string> message_id;
  std::optional<std::string> type;
  std::optional<std::uint64_t> timestamp;      // seconds since the epoch
  std::map<std::string, std::string> headers;  // string-valued headers only
  std::int64_t delivery_count = 0;             // quorum queues: x-delivery-count (0 if absent)
};

// Fills `delivery`'s body, properties and string headers from a received message (the part of
// every delivery that comes from the sender, so the AMQP fuzzer drives it with decoded bytes).
void read_message(const amqp_message_t_& message, Delivery& delivery);

// An Error's message without the "idem: <code>: " prefix what() adds, to wrap it in another.
inline std::string bare_message(const Error& error) {
  const std::string what = error.what();
  const std::string prefix = "idem: " + std::string(error.code_name()) + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

// What idem sends. Views into strings the caller keeps alive for the publish (null: the
// property is left out).
struct Outgoing {
  const std::string* message_id = nullptr;
  const std::string* type = nullptr;
  std::optional<std::uint64_t> timestamp;
  std::map<std::string, std::string> headers;
  std::string_view body;
};

class AmqpConnection {
 public:
  // Connects, logs in and opens channel 1. Throws BrokerError.
  explicit AmqpConnection(const ConnectionOptions& options);
  ~AmqpConnection();
  AmqpConnection(const AmqpConnection&) = delete;
  AmqpConnection& operator=(const AmqpConnection&) = delete;

  bool broken() const noexcept { return broken_; }
  // Reads whatever the broker sent meanwhile without waiting (answering heartbeats): false, and
  // broken(), when it closed the connection — e.g. after missed heartbeats while we sat idle.
  bool alive();
  const std::string& endpoint() const noexcept { return endpoint_; }

  void declare_exchange(const std::string& name, std::string_view type);
  void declare_queue(const std::string& name, bool quorum);
  void bind_queue(const std::string& queue, const std::string& exchange, const std::string& key);
  // Message count of an existing queue (passive declare; a missing queue throws).
  std::uint32_t message_count(const std::string& queue);
  void delete_queue(const std::string& name);
  void delete_exchange(const std::string& name);

  void enable_confirms();
  // Publishes; with confirms enabled waits for the broker's ack (BrokerError on nack/loss).
  void publish(const std::string& exchange, const std::string& routing_key,
               const Outgoing& message);
  // Sends every message, then waits for all their confirms (basic.ack/nack, `multiple` or not),
  // so a batch costs about one broker fsync. Returns normally only when every message was
  // confirmed (or at once after sending without confirms). On a nack, a lost connection or a
  // timeout (rpc timeout without any confirm arriving) throws BrokerError, broken(), after
  // setting `confirmed_prefix` to how many leading messages were confirmed.
  void publish_batch(const std::string& exchange, const std::vector<const std::string*>& keys,
                     const std::vector<Outgoing>& messages, std::size_t& confirmed_prefix);

  void qos(int prefetch);
  void consume(const std::string& queue);
  // The next delivery of the consume, or nullopt after `timeout` (or a frame that is not one).
  std::optional<Delivery> next_delivery(Millis timeout);
  // Waits, reading nothing, until the broker has sent something (a frame is buffered or the
  // socket is readable), `wake_fd` is readable, or `timeout` passed (EINTR also returns).
  void wait_readable(Millis timeout, int wake_fd);
  // basic.get (manual ack); nullopt when the queue is empty.
  std::optional<Delivery> get(const std::string& queue);
  void ack(std::uint64_t tag, bool multiple = false);  // multiple: every unacked tag <= tag
  void nack(std::uint64_t tag, bool requeue);

 private:
  // basic.publish of one message (no waiting); ++published_.
  void send(const std::string& exchange, const std::string& routing_key, const Outgoing& message,
            std::string_view operation);
  void check_rpc(std::string_view operation);
  [[noreturn]] void fail(std::string_view operation, const std::string& reason, bool retryable,
                         bool in_doubt = false);
  void check_status(int status, std::string_view operation);

  struct StateDeleter {
    void operator()(amqp_connection_state_t_* state) const noexcept;  // amqp_destroy_connection
  };
  // Owned from the first line of the constructor, so a constructor that throws still frees it.
  std::unique_ptr<amqp_connection_state_t_, StateDeleter> state_;
  amqp_connection_state_t_* connection_ = nullptr;  // state_.get()
  std::string endpoint_;
  Millis rpc_timeout_;
  bool broken_ = false;
  bool channel_open_ = false;
  bool confirms_ = false;
  std::uint64_t published_ = 0;  // publish sequence number on the channel (confirm tags)
};

}  // namespace idem::rabbitmq::detail
