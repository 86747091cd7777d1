#include "idem/duration.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <limits>
#include <system_error>

#include "idem/detail/printable.hpp"
#include "idem/error.hpp"

namespace idem {
namespace {

detail::UrlDuration bad_duration(std::string_view text, std::string_view problem) {
  return {{},
          "duration '" + detail::printable(text, 64) + "' " + std::string(problem) +
              " (expected a number and a unit: 500ms, 30s, 1.5m, 12h, 7d, 2w)"};
}

// Digits of a fraction that are read: 0.000000001 of a week is well under a millisecond, so
// more digits cannot give another whole number of milliseconds.
constexpr std::size_t kMaxFractionDigits = 9;

detail::UrlDuration checked_duration(std::string_view text) {
  if (text.empty()) return bad_duration(text, "is empty");
  if (text.front() == '-') return bad_duration(text, "is negative");
  std::uint64_t value = 0;
  const char* const last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, value);
  if (end == text.data()) return bad_duration(text, "does not start with a number");
  const bool too_large = ec == std::errc::result_out_of_range;
  // An optional fraction: ".5" of the unit.
  std::uint64_t fraction = 0;
  std::uint64_t scale = 1;
  const char* at = end;
  if (at != last && *at == '.') {
    ++at;
    const char* digits = at;
    while (at != last && *at >= '0' && *at <= '9') {
      if (static_cast<std::size_t>(at - digits) >= kMaxFractionDigits) {
        return bad_duration(text, "has more than 9 digits after the point");
      }
      fraction = fraction * 10 + static_cast<std::uint64_t>(*at - '0');
      scale *= 10;
      ++at;
    }
    if (at == digits) return bad_duration(text, "has no digit after the point");
  }
  const std::string_view unit(at, static_cast<std::size_t>(last - at));
  struct Unit {
    std::string_view name;
    std::uint64_t millis;
  };
  static constexpr std::array<Unit, 6> kUnits{{{"ms", 1},
                                               {"s", 1000},
                                               {"m", 60'000},
                                               {"h", 3'600'000},
                                               {"d", 86'400'000},
                                               {"w", 604'800'000}}};
  if (unit.empty()) return bad_duration(text, "has no unit");
  const auto found =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const Unit& u) { return u.name == unit; });
  if (found == kUnits.end()) {
    return bad_duration(text, "has an unknown unit '" + detail::printable(unit, 16) + "'");
  }
  // fraction * millis < 10^9 * 6.048 * 10^8: no overflow in 64 bits.
  const std::uint64_t fraction_ms = fraction * found->millis;
  if (fraction_ms % scale != 0) {
    return bad_duration(text, "is not a whole number of milliseconds");
  }
  using Rep = std::chrono::milliseconds::rep;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<Rep>::max());
  if (too_large || value > kMax / found->millis ||
      value * found->millis > kMax - fraction_ms / scale) {
    return bad_duration(text, "is too large");
  }
  return {std::chrono::milliseconds(static_cast<Rep>(value * found->millis + fraction_ms / scale)),
          {}};
}

}  // namespace

std::chrono::milliseconds parse_duration(std::string_view text) {
  detail::UrlDuration duration = checked_duration(text);
  if (!duration.problem.empty()) throw ConfigError(duration.problem);
  return duration.value;
}

namespace detail {

UrlDuration url_duration(std::string_view text) {
  UrlDuration duration = checked_duration(text);
  if (duration.problem.empty() && duration.value > kMaxUrlDuration) {
    return {{}, "is longer than 1000d, got '" + printable(text, 64) + "'"};
  }
  return duration;
}

}  // namespace detail
}  // namespace idem
