// Events and event ids.
//
// An Event is one message of the consumer face: a unique id (uuid4 as 32 lowercase hex chars
// when idem makes it), a type used for routing, an opaque payload (often JSON), string headers
// and the time it was created. Deduplication keys on (consumer, id): a redelivered event keeps
// its id, so its side effects can be run once.
//
// Thread-safety: Event is a plain value. new_event_id() is safe to call from any thread and
// stays unique across fork().
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>

#include "idem/clock.hpp"

namespace idem {

// A random (version 4) UUID as 32 lowercase hex characters, e.g.
// "3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e". Random bits come from the OS CSPRNG (getrandom),
// fetched in blocks so a call costs tens of nanoseconds. Safe across fork(): a child never
// repeats its parent's ids.
std::string new_event_id();

// True when `id` has the shape new_event_id() produces (32 lowercase hex, version 4, RFC 4122
// variant). Recorders accept any valid key as an id; this is for producers that want to check.
bool is_uuid4_hex(std::string_view id) noexcept;

struct Event {
  std::string id;                              // unique per logical event; kept on redelivery
  std::string type;                            // routing key, e.g. "order.created"
  std::string payload;                         // opaque bytes, usually JSON
  std::map<std::string, std::string> headers;  // free-form metadata (trace ids, ...)
  WallTime timestamp{};                        // when the event was created

  // A new event with a fresh id and the current wall time.
  static Event make(std::string type, std::string payload,
                    std::map<std::string, std::string> headers = {});
};

}  // namespace idem
