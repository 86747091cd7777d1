// RabbitMqOutboxPublisher: the OutboxPublisher (idem/outbox.hpp) that sends outbox rows through
// a Publisher with publisher confirms, one publish_batch() per relay pass.
//
// Verdicts: a row whose event the Publisher refuses before sending (an id that is not a valid
// key, an empty type or one longer than 255 bytes) is refused with that reason — it would be
// refused every time, so the relay parks it after max_attempts. The other rows go out in one
// publish_batch(): all confirmed → every verdict confirmed. A PublishBatchError after k confirms
// confirms the first k; the row the broker nacked (basic.nack: it did not store the message) is
// refused with the broker's reason, and after a lost connection the rest are left for a later
// pass (neither confirmed nor refused). A failure with nothing confirmed throws, so the relay
// backs off (the broker is down or restarting) without counting refusals.
//
// Thread-safety: as Publisher (internally locked).
#pragma once

#include <memory>

#include "idem/outbox.hpp"
#include "idem/rabbitmq/publisher.hpp"

namespace idem::rabbitmq {

class RabbitMqOutboxPublisher final : public OutboxPublisher {
 public:
  // InvalidArgument for a null publisher.
  explicit RabbitMqOutboxPublisher(std::shared_ptr<Publisher> publisher);
  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override;

 private:
  std::shared_ptr<Publisher> publisher_;
};

}  // namespace idem::rabbitmq
