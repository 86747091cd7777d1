// The argument checks of the recorder and store protocols, written once. Both faces (the
// blocking IdempotencyRecorder/IdempotencyStore and the coroutine AsyncRecorder/AsyncStore)
// call these before they reach a backend, so every backend sees only valid arguments.
#pragma once

#include <chrono>
#include <string_view>

#include "idem/clock.hpp"

namespace idem::detail {

// InvalidKey naming "consumer" or "event id" and the reason (see validate_key()).
void check_marker_key(std::string_view consumer, std::string_view event_id);
// InvalidKey naming "idempotency key".
void check_idempotency_key(std::string_view key);
// InvalidArgument unless lease > 0.
void check_lease(Millis lease);
// InvalidArgument unless ttl >= 0.
void check_ttl(Millis ttl);
// InvalidArgument unless older_than >= 0.
void check_older_than(std::chrono::system_clock::duration older_than);

}  // namespace idem::detail
