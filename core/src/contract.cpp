#include "idem/detail/contract.hpp"

#include <string>

#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::detail {

void check_marker_key(std::string_view consumer, std::string_view event_id) {
  validate_key("consumer", consumer);
  validate_key("event id", event_id);
}

void check_idempotency_key(std::string_view key) {
  validate_key("idempotency key", key);
}

void check_lease(Millis lease) {
  if (lease <= Millis::zero()) {
    throw InvalidArgument("idempotency lease must be positive (got " +
                          std::to_string(lease.count()) + " ms)");
  }
}

void check_ttl(Millis ttl) {
  if (ttl < Millis::zero()) {
    throw InvalidArgument("idempotency ttl must not be negative (got " +
                          std::to_string(ttl.count()) + " ms)");
  }
}

void check_older_than(std::chrono::system_clock::duration older_than) {
  if (older_than < std::chrono::system_clock::duration::zero()) {
    throw InvalidArgument("purge: older_than must not be negative (got " +
                          std::to_string(std::chrono::duration_cast<Millis>(older_than).count()) +
                          " ms)");
  }
}

}  // namespace idem::detail
