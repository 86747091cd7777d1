// Publisher: sends idem::Event to a RabbitMQ exchange, durably.
//
// Each event becomes one persistent message (delivery_mode 2): routing key and `type` property =
// event.type, `message_id` = event.id, `timestamp` = event.timestamp in whole seconds, the
// headers as an AMQP table of string values, the body = event.payload (any bytes, NULs
// included). The exchange is declared durable on connect (its type must match an existing one).
//
// With confirms (the default) publish() returns only once the broker has taken responsibility
// for the message (basic.ack under publisher confirms: persisted to every queue it was routed
// to). Otherwise it throws BrokerError: retryable; in_doubt when the message was sent but its
// confirm never arrived (it may have been stored — publishing again may then deliver it twice,
// which idem's consumers drop by event id). An event no queue is bound for is acknowledged and
// dropped by the broker, as AMQP does.
//
// Before sending, publish() reads without waiting what the broker sent meanwhile, so a
// connection it closed while the publisher sat idle (missed heartbeats, a restart) is replaced
// first. A connection that fails during a publish makes it throw; the next publish reconnects
// (one attempt, no backoff: the caller decides whether and when to retry).
//
// publish_batch() sends a whole batch and then waits for all its confirms, so a batch costs about
// one broker fsync instead of one per event (a confirmed publish to a quorum queue is ~3 ms).
//
// Thread-safety: a Publisher is internally locked, so several threads may share one; publishes
// are then serialised on its single connection. For throughput give each thread its own.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "idem/event.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/options.hpp"

namespace idem::rabbitmq {

// A publish_batch() that failed part way: confirmed() leading events were confirmed.
class PublishBatchError : public BrokerError {
 public:
  PublishBatchError(const std::string& message, bool in_doubt, std::size_t confirmed)
      : BrokerError(message, /*retryable=*/true, in_doubt), confirmed_(confirmed) {}
  // How many events from the start of the batch the broker confirmed (stored).
  std::size_t confirmed() const noexcept { return confirmed_; }

 private:
  std::size_t confirmed_;
};

enum class ExchangeType { topic, fanout };

struct PublisherOptions {
  // Exchange events go to. Default "idem.events". Must be non-empty (the default exchange "" is
  // not for events: it routes by queue name).
  std::string exchange = "idem.events";
  // Type the exchange is declared with. Default topic.
  ExchangeType exchange_type = ExchangeType::topic;
  // Wait for the broker's confirm on each publish. Default true. Without confirms publish()
  // returns once the message is written to the socket, and a broker crash can lose it.
  bool confirms = true;
};

struct PublisherStats {
  std::uint64_t published = 0;   // events of publish()/publish_batch() calls that returned normally
  std::uint64_t failed = 0;      // publish()/publish_batch() calls that threw
  std::uint64_t reconnects = 0;  // connections opened after the first
};

class Publisher {
 public:
  // Validates the options (ConfigError) and connects (BrokerError when the broker is down).
  Publisher(ConnectionOptions connection, PublisherOptions options = {});
  ~Publisher();  // closes the connection
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Throws InvalidKey for an id that is not a valid key, InvalidArgument for an empty type or a
  // type longer than 255 bytes (an AMQP routing key), BrokerError as above.
  void publish(const Event& event);

  // Publishes every event in order, then waits for all their confirms; returns events.size()
  // once every one was confirmed (without confirms: once all were written to the socket). The
  // whole batch is validated first, as publish() does: an invalid event throws InvalidKey or
  // InvalidArgument naming its index, and nothing is sent. Failures throw PublishBatchError (a
  // BrokerError, retryable): events [0, confirmed()) are stored by the broker; the others are in
  // doubt (in_doubt() unless none was sent) — some may be stored, some not. Re-publishing the
  // rest, or the whole batch, is safe for idem consumers: they drop duplicates by event id.
  // An empty batch sends nothing and returns 0.
  std::size_t publish_batch(std::span<const Event> events);

  PublisherStats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

std::string_view to_string(ExchangeType type) noexcept;

}  // namespace idem::rabbitmq
