#include "iso_time.hpp"

#include <chrono>
#include <cstdint>
#include <string>

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
  // Written digit by digit: a report and an event each format one or two of these per call.
  // WallTime's 64-bit nanoseconds span the years 1677..2262, always four digits.
  std::string out(30, '0');  // YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ
  const auto put = [&out](std::size_t end, long long value) {
    for (std::size_t at = end; value > 0; value /= 10)
      out[--at] = static_cast<char>('0' + value % 10);
  };
  put(4, static_cast<int>(date.year()));
  out[4] = '-';
  put(7, static_cast<unsigned>(date.month()));
  out[7] = '-';
  put(10, static_cast<unsigned>(date.day()));
  out[10] = 'T';
  put(13, clock_time.hours().count());
  out[13] = ':';
  put(16, clock_time.minutes().count());
  out[16] = ':';
  put(19, clock_time.seconds().count());
  out[19] = '.';
  put(29, clock_time.subseconds().count());
  out[29] = 'Z';
  return out;
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
