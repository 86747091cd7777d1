// Retry: how many attempts, how long to wait between them, and which failures deserve another.
//
// RetryPolicy is a plain struct. A resilient operation makes up to max_attempts attempts; after
// a failed attempt that is retryable (see below) and not the last, it waits
// Backoff::delay(retry, u) through Clock::sleep_for — so idem::testing::ManualClock makes the
// wait instant and records it — and tries again.
//
// Backoff: exponential, capped, with jitter. For the n-th retry (n = 1 before attempt 2):
//     d = min(cap, base * multiplier^(n-1))
//     delay = d * (1 - jitter * u),   u drawn from the random source in [0, 1)
// so jitter = 1 is "full jitter" (uniform in (0, d]) and jitter = 0 is none.
//
// Which failures are retried, in this order (the first rule that applies decides):
//   1. idem::ValidationError        — when retry_invalid_results is set (the default, as in
//                                     relprim, Polly and resilience4j: an invalid result is a
//                                     failed attempt);
//   2. idem::CircuitOpenError       — never: a breaker rejection ends the retries;
//   3. idem::InvalidArgument (and its ConfigError / InvalidKey), ReentryError, KeyReuseError,
//      Cancelled                    — never: the same call fails the same way;
//   4. an idem::Error with in_doubt() — never, unless retry_in_doubt is set: the write may have
//      happened and running it again could do it twice;
//   5. retry_on, if set             — its answer (it sees every std::exception);
//   6. otherwise                    — idem::Error: retryable() (or in_doubt() once opted in);
//                                     any other std::exception: yes; a non-std exception: no.
//
// Thread-safety: RetryPolicy and Backoff are plain values. The default random source is
// thread-local. A user-supplied random source is called under the operation's lock, so it need
// not be thread-safe.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string_view>
#include <utility>

namespace idem {

struct Backoff {
  // Delay before the first retry, before jitter. >= 0. Default 100 ms.
  std::chrono::nanoseconds base = std::chrono::milliseconds(100);
  // Growth factor per retry. >= 1. Default 2.
  double multiplier = 2.0;
  // Upper bound of any delay, before jitter. >= base. Default 10 s.
  std::chrono::nanoseconds cap = std::chrono::seconds(10);
  // Fraction of the delay that is randomised, in [0, 1]: 1 = full jitter, 0 = none. Default 1.
  double jitter = 1.0;

  // The delay before retry number `retry` (1-based) given a draw `u` (clamped into [0, 1)).
  std::chrono::nanoseconds delay(int retry, double u) const noexcept;

  // Throws ConfigError naming `owner` and the bad field.
  void validate(std::string_view owner) const;
};

// Returns values in [0, 1).
using RandomSource = std::function<double()>;

// A thread-local std::mt19937_64 seeded from std::random_device.
double default_random() noexcept;

// A RandomSource drawing from a uniform random bit generator, e.g. a seeded std::mt19937 for a
// reproducible test: `.random = idem::random_source_from(std::mt19937(42))`. The engine is
// shared by copies of the source (idem calls it under a lock).
template <class URBG>
RandomSource random_source_from(URBG engine) {
  return [engine = std::make_shared<URBG>(std::move(engine))] {
    const double u = std::generate_canonical<double, 53>(*engine);
    return u < 1.0 ? u : 0.0;  // generate_canonical may round up to 1.0
  };
}

// A test on a failure: retried (retry_on), a rate limit (rate_limit_on), starts the fallbacks
// (fallback_on), counts for the breaker (record_failure_on).
using FailurePredicate = std::function<bool(const std::exception&)>;

// Decides whether a failed attempt is retried (rule 5 above).
using RetryPredicate = FailurePredicate;

// A predicate that accepts exactly the exceptions of the listed types (or types derived from
// them), e.g. `.rate_limit_on = idem::failures_of<TooManyRequests>()`.
template <class... Exceptions>
FailurePredicate failures_of() {
  static_assert(sizeof...(Exceptions) > 0, "failures_of needs at least one exception type");
  return [](const std::exception& error) {
    return ((dynamic_cast<const Exceptions*>(&error) != nullptr) || ...);
  };
}

// Rule 6 above.
bool default_retry_on(const std::exception& error) noexcept;

// A predicate that retries exactly the exceptions of the listed types (or types derived from
// them), e.g. `.retry_on = idem::retry_on_types<std::system_error, GatewayBusy>()`.
template <class... Exceptions>
RetryPredicate retry_on_types() {
  static_assert(sizeof...(Exceptions) > 0, "retry_on_types needs at least one exception type");
  return [](const std::exception& error) {
    return ((dynamic_cast<const Exceptions*>(&error) != nullptr) || ...);
  };
}

struct RetryPolicy {
  // Total attempts of the primary operation, the first included. >= 1. Default 3.
  int max_attempts = 3;
  // Waits between attempts. Default: 100 ms doubling up to 10 s, full jitter.
  Backoff backoff{};
  // Which failures are retried (rule 5). Default: empty, i.e. default_retry_on.
  RetryPredicate retry_on{};
  // Retry failures whose outcome is in doubt (Error::in_doubt()). Default false.
  bool retry_in_doubt = false;
  // Retry results a validator rejected (ValidationError). Default true.
  bool retry_invalid_results = true;
  // Jitter draws in [0, 1). Default: empty, i.e. default_random.
  RandomSource random{};

  // Throws ConfigError naming `owner` and the bad field.
  void validate(std::string_view owner) const;

  // Applies rules 1-6 to a failed attempt. Never throws.
  bool should_retry(const std::exception_ptr& error) const noexcept;
};

}  // namespace idem
