#include "idem/rabbitmq/outbox_publisher.hpp"

#include <string>
#include <vector>

#include "idem/key.hpp"

namespace idem::rabbitmq {

namespace {

// What Publisher::publish() would refuse before sending; empty when the event may go.
std::string refusal_of(const Event& event) {
  try {
    validate_key("event id", event.id);
  } catch (const InvalidKey& e) {
    return e.what();
  }
  if (event.type.empty()) return "event " + event.id + " has no type (the routing key)";
  if (event.type.size() > 255) {
    return "event " + event.id + " has a type of " + std::to_string(event.type.size()) +
           " bytes; an AMQP routing key holds at most 255";
  }
  return {};
}

}  // namespace

RabbitMqOutboxPublisher::RabbitMqOutboxPublisher(std::shared_ptr<Publisher> publisher)
    : publisher_(std::move(publisher)) {
  if (!publisher_) throw InvalidArgument("RabbitMqOutboxPublisher needs a Publisher (got null)");
}

std::vector<PublishVerdict> RabbitMqOutboxPublisher::publish(std::span<const OutboxRow> rows) {
  std::vector<PublishVerdict> verdicts(rows.size());
  std::vector<Event> events;
  std::vector<std::size_t> positions;
  events.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    verdicts[i].refusal = refusal_of(rows[i].event);
    if (!verdicts[i].refusal.empty()) continue;
    events.push_back(rows[i].event);
    positions.push_back(i);
  }
  if (events.empty()) return verdicts;
  try {
    publisher_->publish_batch(events);
    for (std::size_t i : positions)
      verdicts[i].confirmed = true;
  } catch (const PublishBatchError& e) {
    const std::size_t confirmed = e.confirmed();
    if (confirmed == 0 && std::string_view(e.what()).find("nacked") == std::string_view::npos) {
      throw;  // nothing gained: let the relay back off
    }
    for (std::size_t k = 0; k < confirmed && k < positions.size(); ++k)
      verdicts[positions[k]].confirmed = true;
    if (confirmed < positions.size() &&
        std::string_view(e.what()).find("nacked") != std::string_view::npos) {
      verdicts[positions[confirmed]].refusal = e.what();  // the broker did not store it
    }
  }
  return verdicts;
}

}  // namespace idem::rabbitmq
