// The argument checks of the recorder and store protocols, written once. Both faces (the
// blocking IdempotencyRecorder/IdempotencyStore and the coroutine AsyncRecorder/AsyncStore)
// call these before they reach a backend, so every backend sees only valid arguments. And the
// rule every store's wait() waits by (held_at), also written once.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"

namespace idem::detail {

// InvalidKey naming "consumer" or "event id" and the reason (see validate_key()).
void check_marker_key(std::string_view consumer, std::string_view event_id);
// InvalidKey naming "idempotency key".
void check_idempotency_key(std::string_view key);
// InvalidKey unless `prefix` could start an idempotency key: "" (every key), or at most
// kMaxKeyLength bytes without a control character.
void check_key_prefix(std::string_view prefix);
// InvalidArgument unless 1 <= limit <= kMaxListLimit.
void check_list_limit(std::size_t limit);
// InvalidArgument unless lease > 0.
void check_lease(Millis lease);
// InvalidArgument unless ttl >= 0.
void check_ttl(Millis ttl);
// InvalidArgument unless older_than >= 0.
void check_older_than(std::chrono::system_clock::duration older_than);

// True when `record` is a claim whose lease has not ended at `now`: what a waiter (wait())
// keeps waiting on. False for an absent or completed record and for an abandoned claim.
[[nodiscard]] inline bool held_at(const std::optional<IdempotencyRecord>& record,
                                  WallTime now) noexcept {
  return record && record->state == IdempotencyRecord::State::in_progress &&
         record->lease_until > now;
}

}  // namespace idem::detail
