// Rate limits: recover from a provider that rejected a call because of its quota (HTTP 429,
// "slow down"), waiting as long as the provider asks instead of the backoff.
//
//   .retries = 3,
//   .rate_limit = {.rate_limit_on = idem::failures_of<TooManyRequests>(),
//                  .retry_after = [](const std::exception& e) {
//                    return idem::parse_retry_after(
//                        dynamic_cast<const TooManyRequests&>(e).retry_after_header,
//                        std::chrono::system_clock::now());
//                  },
//                  .max_wait = 30s}
//
// For each failed primary attempt that rate_limit_on accepts (a "rate-limited failure"):
//   1. retry_after, if set, extracts the provider's delay (nullopt: the provider gave none). An
//      extractor that throws, or returns a negative delay, ends the retries with
//      idem::RetryAfterExtractionError — an untrusted delay is never waited out; that error is
//      then the attempt's failure (as in relprim), not a rate limit;
//   2. the delay of the next retry is the provider's when there is one (delay source
//      "provider"), else the backoff's ("backoff");
//   3. a delay longer than max_wait ends the retries with idem::RateLimitWaitExceeded (which
//      carries the wait and the rate-limited failure); nothing is waited;
//   4. otherwise the retry is scheduled like any other. A rate-limited failure is retried even
//      when retry_on would not retry it; rate limits never add attempts: max_attempts / retries
//      still bounds them, so without retries a rate limit just fails the call.
// Events rate_limit.detected and rate_limit.wait_exceeded (before the attempt's attempt.failed),
// and per-attempt / per-report metadata (rate_limited, rate_limit_*), say what happened
// (docs/resilience.md). Once the
// retries end, the circuit breaker and the fallbacks see a rate-limited failure like any other.
//
// This is recovery after a rejection, not a throttle: nothing here limits the rate of calls.
//
// Thread-safety: RateLimitPolicy is a plain value; its functions are called concurrently from
// every thread that calls the operation. parse_retry_after is a pure function.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string_view>

#include "idem/clock.hpp"

namespace idem {

struct RateLimitPolicy {
  // Which failures are rate limits. Default: empty = rate limits are not handled (every other
  // field is then ignored).
  std::function<bool(const std::exception&)> rate_limit_on{};
  // The provider's delay for a rate-limited failure; nullopt when it gave none. Default: empty =
  // always the backoff's delay.
  std::function<std::optional<std::chrono::nanoseconds>(const std::exception&)> retry_after{};
  // The longest wait accepted before a retry; a longer one ends the retries with
  // RateLimitWaitExceeded. >= 0. Default 60 s.
  std::chrono::nanoseconds max_wait = std::chrono::seconds(60);

  bool enabled() const noexcept { return static_cast<bool>(rate_limit_on); }
  // Throws ConfigError naming `owner`: retry_after without rate_limit_on, max_wait < 0.
  void validate(std::string_view owner) const;
};

// Where the wait before a retry came from.
enum class DelaySource { backoff, provider };
// "backoff", "provider".
std::string_view to_string(DelaySource source) noexcept;

// Parses an HTTP Retry-After field value (RFC 9110 §10.2.3): delay-seconds ("120") or an
// HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT"; the obsolete RFC 850 and asctime forms are
// accepted too, as RFC 9110 §5.6.7 asks of recipients). Surrounding whitespace is ignored.
// Returns the delay from `now` (a date in the past gives zero), or nullopt when the value is
// neither form — a missing hint, so the backoff applies.
std::optional<std::chrono::nanoseconds> parse_retry_after(std::string_view value, WallTime now);

}  // namespace idem
