// Operator helpers for idem's RabbitMQ topology: read the dead-letter queue, delete queues and
// exchanges (tests use them to clean up).
//
// Each call opens its own short connection. Thread-safety: the functions share nothing.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "idem/event.hpp"
#include "idem/rabbitmq/options.hpp"

namespace idem::rabbitmq {

// A message taken from a dead-letter queue.
struct DeadLetterMessage {
  Event event;              // id may be empty or invalid (that is why it is there)
  std::string reason;       // x-idem-reason
  std::string consumer;     // x-idem-consumer
  std::string routing_key;  // x-idem-routing-key: where it was originally published
  int deliveries = 0;       // x-idem-deliveries: failed deliveries before it was dead-lettered
};

// Takes (gets and acks) up to `max` messages from `queue`, oldest first. The x-idem-* headers
// are moved out of event.headers into the fields above.
std::vector<DeadLetterMessage> take_dead_letters(const ConnectionOptions& connection,
                                                 const std::string& queue, std::size_t max);

// How many messages are ready in `queue` (0 if it does not exist).
std::size_t queue_depth(const ConnectionOptions& connection, const std::string& queue);

// Deletes a queue / an exchange; missing ones are not an error.
void delete_queue(const ConnectionOptions& connection, const std::string& queue);
void delete_exchange(const ConnectionOptions& connection, const std::string& exchange);

}  // namespace idem::rabbitmq
