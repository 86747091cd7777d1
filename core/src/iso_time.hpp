// Internal: ISO-8601 UTC text for WallTime, with nanoseconds, for reports and events.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.hpp"

namespace idem::detail {

// "2030-01-01T00:00:00.123456789Z" — always nine fraction digits, so text order is time order.
std::string format_iso8601(WallTime time);

// Parses "YYYY-MM-DDTHH:MM:SS[.fraction]Z" (fraction of 1-9 digits; "+00:00" accepted for Z).
// nullopt for anything else, including out-of-range fields and years outside 1700..2200
// (WallTime holds 64-bit nanoseconds).
std::optional<WallTime> parse_iso8601(std::string_view text);

}  // namespace idem::detail
