// Helpers shared by the publisher, the consumer and the admin calls (internal).
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "amqp_connection.hpp"
#include "idem/event.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"

namespace idem::rabbitmq::detail {

// Throws ConfigError for options no connection can use.
void validate_connection_options(const ConnectionOptions& options);

// Checks an exchange or queue name (AMQP short string: at most 255 bytes). `what` names it.
void validate_amqp_name(std::string_view what, const std::string& name, bool allow_empty = false);

// The message an event becomes; it points into `event`, which must outlive it. Throws InvalidKey /
// InvalidArgument for an event that cannot be sent (bad id, empty or too long type, a header name
// longer than 255 bytes).
Outgoing to_outgoing(const Event& event);

// What a delivery carries: the Event, or why it is malformed (no message_id, or one that is not
// a valid idem key — dead-lettered without running the handler). The type is the `type`
// property, else (absent or empty) the routing key; a timestamp beyond what WallTime can hold is
// left unset. Never throws for any delivery (fuzzed: fuzz/rabbitmq_message_fuzzer.cpp).
struct IncomingEvent {
  std::optional<Event> event;    // set when the delivery is well-formed
  std::string malformed_reason;  // otherwise: "malformed: ..."
};
IncomingEvent event_from_delivery(const Delivery& delivery);

// Waits `duration` on `clock` in slices of at most `slice`, returning early (false) once `stop`
// is set.
bool wait_unless_stopped(Clock& clock, Millis duration, Millis slice,
                         const std::atomic<bool>& stop);

}  // namespace idem::rabbitmq::detail
