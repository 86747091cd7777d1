#include "idem/detail/contract.hpp"

#include <string>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/key.hpp"

namespace idem::detail {

void check_marker_key(std::string_view consumer, std::string_view event_id) {
  validate_key("consumer", consumer);
  validate_key("event id", event_id);
}

void check_idempotency_key(std::string_view key) {
  validate_key("idempotency key", key);
}

void check_key_prefix(std::string_view prefix) {
  if (prefix.size() > kMaxKeyLength) {
    throw InvalidKey("key prefix is too long (" + std::to_string(prefix.size()) +
                     " bytes, at most " + std::to_string(kMaxKeyLength) + ")");
  }
  for (const char c : prefix) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) throw InvalidKey("key prefix contains a control character");
  }
}

void check_list_limit(std::size_t limit) {
  if (limit == 0 || limit > kMaxListLimit) {
    throw InvalidArgument("list: limit must be 1 to " + std::to_string(kMaxListLimit) + " (got " +
                          std::to_string(limit) + ")");
  }
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
