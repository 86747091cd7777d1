#include "idem/rate_limit.hpp"

#include <array>
#include <cctype>
#include <cstdint>
#include <string>

#include "idem/error.hpp"

namespace idem {

void RateLimitPolicy::validate(std::string_view owner) const {
  if (retry_after && !rate_limit_on) {
    throw ConfigError(std::string(owner) +
                      ": retry_after is set but rate_limit_on is not (which failures are rate "
                      "limits?)");
  }
  if (max_wait < std::chrono::nanoseconds::zero()) {
    throw ConfigError(std::string(owner) + ": max_rate_limit_wait must be >= 0");
  }
}

std::string_view to_string(DelaySource source) noexcept {
  return source == DelaySource::provider ? "provider" : "backoff";
}

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

// A small cursor over the field value; every read fails softly.
struct Cursor {
  std::string_view rest;
  bool ok = true;

  bool literal(std::string_view expected) {
    if (!ok || rest.substr(0, expected.size()) != expected) return ok = false;
    rest.remove_prefix(expected.size());
    return true;
  }
  // Exactly `digits` digits (or 1-2 when digits == 0, for asctime's padded day).
  int number(int digits) {
    if (!ok) return 0;
    int value = 0;
    int read = 0;
    const int most = digits == 0 ? 2 : digits;
    while (read < most && !rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front()))) {
      value = value * 10 + (rest.front() - '0');
      rest.remove_prefix(1);
      ++read;
    }
    if (read == 0 || (digits != 0 && read != digits)) ok = false;
    return value;
  }
  // One of `names` (3 letters), returns its index.
  int name(const std::array<std::string_view, 12>& names, std::size_t count) {
    if (!ok) return 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (rest.substr(0, 3) == names[i]) {
        rest.remove_prefix(3);
        return static_cast<int>(i);
      }
    }
    ok = false;
    return 0;
  }
  bool day_name_long() {
    static constexpr std::array<std::string_view, 7> kLong = {
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
    for (auto day : kLong) {
      if (rest.substr(0, day.size()) == day) {
        rest.remove_prefix(day.size());
        return true;
      }
    }
    return ok = false;
  }
};

constexpr std::array<std::string_view, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
constexpr std::array<std::string_view, 12> kDays = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat",
                                                    "Sun", "",    "",    "",    "",    ""};

struct Civil {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

std::optional<WallTime> to_wall(const Civil& c) {
  using namespace std::chrono;
  const year_month_day date{year(c.year), month(static_cast<unsigned>(c.month)),
                            day(static_cast<unsigned>(c.day))};
  if (!date.ok() || c.hour > 23 || c.minute > 59 || c.second > 60) return std::nullopt;
  return WallTime(sys_days(date)) + hours(c.hour) + minutes(c.minute) + seconds(c.second);
}

void time_of_day(Cursor& in, Civil& c) {
  c.hour = in.number(2);
  in.literal(":");
  c.minute = in.number(2);
  in.literal(":");
  c.second = in.number(2);
}

std::optional<WallTime> parse_http_date(std::string_view text, WallTime now) {
  // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
  {
    Cursor in{text};
    Civil c;
    in.name(kDays, 7);
    in.literal(", ");
    c.day = in.number(2);
    in.literal(" ");
    c.month = in.name(kMonths, 12) + 1;
    in.literal(" ");
    c.year = in.number(4);
    in.literal(" ");
    time_of_day(in, c);
    in.literal(" GMT");
    if (in.ok && in.rest.empty()) return to_wall(c);
  }
  // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT (a two-digit year more than 50 years in the future
  // is in the past century, RFC 9110 §5.6.7)
  {
    Cursor in{text};
    Civil c;
    in.day_name_long();
    in.literal(", ");
    c.day = in.number(2);
    in.literal("-");
    c.month = in.name(kMonths, 12) + 1;
    in.literal("-");
    const int yy = in.number(2);
    in.literal(" ");
    time_of_day(in, c);
    in.literal(" GMT");
    if (in.ok && in.rest.empty()) {
      const auto today = std::chrono::year_month_day(std::chrono::floor<std::chrono::days>(now));
      const int this_year = static_cast<int>(today.year());
      c.year = (this_year / 100) * 100 + yy;
      if (c.year > this_year + 50) c.year -= 100;
      return to_wall(c);
    }
  }
  // asctime: Sun Nov  6 08:49:37 1994
  {
    Cursor in{text};
    Civil c;
    in.name(kDays, 7);
    in.literal(" ");
    c.month = in.name(kMonths, 12) + 1;
    in.literal(" ");
    if (in.ok && !in.rest.empty() && in.rest.front() == ' ') in.rest.remove_prefix(1);
    c.day = in.number(0);
    in.literal(" ");
    time_of_day(in, c);
    in.literal(" ");
    c.year = in.number(4);
    if (in.ok && in.rest.empty()) return to_wall(c);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::chrono::nanoseconds> parse_retry_after(std::string_view value, WallTime now) {
  value = trim(value);
  if (value.empty()) return std::nullopt;
  bool digits = true;
  for (char c : value)
    digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
  if (digits) {
    // delay-seconds = 1*DIGIT. Absurdly large values saturate at about 292 years of nanoseconds.
    constexpr std::uint64_t kMaxSeconds = 9'000'000'000ULL;
    std::uint64_t seconds = 0;
    for (char c : value) {
      seconds = seconds * 10 + static_cast<std::uint64_t>(c - '0');
      if (seconds > kMaxSeconds) {
        seconds = kMaxSeconds;
        break;
      }
    }
    return std::chrono::seconds(static_cast<std::int64_t>(seconds));
  }
  const auto when = parse_http_date(value, now);
  if (!when) return std::nullopt;
  if (*when <= now) return std::chrono::nanoseconds::zero();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(*when - now);
}

}  // namespace idem
