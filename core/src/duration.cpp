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
              " (expected a whole number and a unit: 500ms, 30s, 15m, 12h, 7d)"};
}

detail::UrlDuration checked_duration(std::string_view text) {
  if (text.empty()) return bad_duration(text, "is empty");
  if (text.front() == '-') return bad_duration(text, "is negative");
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (end == text.data()) return bad_duration(text, "does not start with a whole number");
  const std::string_view unit = text.substr(static_cast<std::size_t>(end - text.data()));
  struct Unit {
    std::string_view name;
    std::uint64_t millis;
  };
  static constexpr std::array<Unit, 5> kUnits{
      {{"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}}};
  if (unit.empty()) return bad_duration(text, "has no unit");
  const auto found =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const Unit& u) { return u.name == unit; });
  if (found == kUnits.end()) {
    return bad_duration(text, "has an unknown unit '" + detail::printable(unit, 16) + "'");
  }
  using Rep = std::chrono::milliseconds::rep;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<Rep>::max());
  if (ec == std::errc::result_out_of_range || value > kMax / found->millis) {
    return bad_duration(text, "is too large");
  }
  return {std::chrono::milliseconds(static_cast<Rep>(value * found->millis)), {}};
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
