#include "idem/rabbitmq/admin.hpp"

#include <cstdlib>

#include "amqp_connection.hpp"
#include "internal.hpp"

namespace idem::rabbitmq {
namespace {

std::string take_header(std::map<std::string, std::string>& headers, const std::string& key) {
  const auto found = headers.find(key);
  if (found == headers.end()) return {};
  std::string value = std::move(found->second);
  headers.erase(found);
  return value;
}

}  // namespace

std::vector<DeadLetterMessage> take_dead_letters(const ConnectionOptions& connection,
                                                 const std::string& queue, std::size_t max) {
  detail::validate_connection_options(connection);
  detail::validate_amqp_name("queue", queue);
  detail::AmqpConnection amqp(connection);
  std::vector<DeadLetterMessage> taken;
  while (taken.size() < max) {
    auto delivery = amqp.get(queue);
    if (!delivery) break;
    DeadLetterMessage message;
    message.event.id = delivery->message_id.value_or("");
    message.event.type = delivery->type.value_or("");
    message.event.payload = std::move(delivery->body);
    message.event.headers = std::move(delivery->headers);
    message.event.timestamp =
        WallTime(std::chrono::seconds(static_cast<std::int64_t>(delivery->timestamp.value_or(0))));
    message.reason = take_header(message.event.headers, "x-idem-reason");
    message.consumer = take_header(message.event.headers, "x-idem-consumer");
    message.routing_key = take_header(message.event.headers, "x-idem-routing-key");
    message.deliveries = std::atoi(take_header(message.event.headers, "x-idem-deliveries").c_str());
    amqp.ack(delivery->tag);
    taken.push_back(std::move(message));
  }
  return taken;
}

std::size_t queue_depth(const ConnectionOptions& connection, const std::string& queue) {
  detail::validate_connection_options(connection);
  detail::validate_amqp_name("queue", queue);
  detail::AmqpConnection amqp(connection);
  try {
    return amqp.message_count(queue);
  } catch (const BrokerError& e) {
    if (!e.retryable()) return 0;  // 404: no such queue
    throw;
  }
}

void delete_queue(const ConnectionOptions& connection, const std::string& queue) {
  detail::validate_connection_options(connection);
  detail::validate_amqp_name("queue", queue);
  detail::AmqpConnection amqp(connection);
  amqp.delete_queue(queue);
}

void delete_exchange(const ConnectionOptions& connection, const std::string& exchange) {
  detail::validate_connection_options(connection);
  detail::validate_amqp_name("exchange", exchange);
  detail::AmqpConnection amqp(connection);
  amqp.delete_exchange(exchange);
}

}  // namespace idem::rabbitmq
