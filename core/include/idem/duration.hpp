// Durations written as text: a non-negative number and a unit, "500ms", "30s", "15m", "1.5h",
// "7d", "2w" (ms, s, m, h, d, w: a week is 7 days). A fraction is allowed when the duration is a
// whole number of milliseconds ("1.5s", "0.25h"; not "0.0001s"). The one grammar for every duration
// idem reads from text: the URL parameters of every scheme (idem/open.hpp, RedisOptions::from_url)
// and the CLI's options.
//
// Thread-safety: pure functions; call them from any thread.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace idem {

// The duration `text` names. Throws ConfigError for anything else (no unit, an unknown unit, a
// sign, spaces, a fraction finer than a millisecond, or a value beyond
// std::chrono::milliseconds' range).
std::chrono::milliseconds parse_duration(std::string_view text);

namespace detail {

// The longest duration a URL parameter may give. Backends add timeouts to the current time; a
// bound far below the type's range keeps that from overflowing.
inline constexpr std::chrono::hours kMaxUrlDuration{24 * 1000};

// A duration read from a URL parameter: `problem` is empty and `value` holds it, or `problem`
// says what is wrong ("duration '5' has no unit (expected ...)", "is longer than 1000d, got
// '2000d'"), for the caller to put after the parameter's name.
struct UrlDuration {
  std::chrono::milliseconds value{};
  std::string problem;
};
UrlDuration url_duration(std::string_view text);

}  // namespace detail
}  // namespace idem
