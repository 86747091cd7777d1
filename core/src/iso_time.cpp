#include "iso_time.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace idem::detail {
namespace {

using std::chrono::days;
using std::chrono::nanoseconds;

}  // namespace

std::string format_iso8601(WallTime time) {
  const auto since_epoch = std::chrono::duration_cast<nanoseconds>(time.time_since_epoch());
  const auto day = std::chrono::floor<days>(since_epoch);
  const std::chrono::year_month_day date{std::chrono::sys_days{day}};
  const nanoseconds in_day = since_epoch - day;
  const std::chrono::hh_mm_ss<nanoseconds> clock_time{in_day};
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%04d-%02u-%02uT%02d:%02d:%02d.%09lldZ",
                static_cast<int>(date.year()), static_cast<unsigned>(date.month()),
                static_cast<unsigned>(date.day()), static_cast<int>(clock_time.hours().count()),
                static_cast<int>(clock_time.minutes().count()),
                static_cast<int>(clock_time.seconds().count()),
                static_cast<long long>(clock_time.subseconds().count()));
  return buffer;
}

namespace {

bool read_digits(std::string_view text, std::size_t& pos, std::size_t count, int& out) {
  if (pos + count > text.size()) return false;
  int value = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const char c = text[pos + i];
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  pos += count;
  out = value;
  return true;
}

bool expect(std::string_view text, std::size_t& pos, char c) {
  if (pos >= text.size() || text[pos] != c) return false;
  ++pos;
  return true;
}

}  // namespace

std::optional<WallTime> parse_iso8601(std::string_view text) {
  std::size_t pos = 0;
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!read_digits(text, pos, 4, year) || !expect(text, pos, '-') ||
      !read_digits(text, pos, 2, month) || !expect(text, pos, '-') ||
      !read_digits(text, pos, 2, day) || !expect(text, pos, 'T') ||
      !read_digits(text, pos, 2, hour) || !expect(text, pos, ':') ||
      !read_digits(text, pos, 2, minute) || !expect(text, pos, ':') ||
      !read_digits(text, pos, 2, second)) {
    return std::nullopt;
  }
  std::int64_t fraction = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (++digits > 9) return std::nullopt;
      fraction = fraction * 10 + (text[pos] - '0');
      ++pos;
    }
    if (digits == 0) return std::nullopt;
    for (int i = digits; i < 9; ++i)
      fraction *= 10;
  }
  const std::string_view zone = text.substr(pos);
  if (zone != "Z" && zone != "+00:00") return std::nullopt;
  if (hour > 23 || minute > 59 || second > 59) return std::nullopt;
  // WallTime counts nanoseconds in 64 bits: about 1678..2262. Stay well inside.
  if (year < 1700 || year > 2200) return std::nullopt;
  const std::chrono::year_month_day date{std::chrono::year{year},
                                         std::chrono::month{static_cast<unsigned>(month)},
                                         std::chrono::day{static_cast<unsigned>(day)}};
  if (!date.ok()) return std::nullopt;
  const auto since_epoch = std::chrono::sys_days{date}.time_since_epoch() +
                           std::chrono::hours(hour) + std::chrono::minutes(minute) +
                           std::chrono::seconds(second) + nanoseconds(fraction);
  return WallTime(std::chrono::duration_cast<WallTime::duration>(since_epoch));
}

}  // namespace idem::detail
