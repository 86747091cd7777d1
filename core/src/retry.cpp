#include "idem/retry.hpp"

#include <cmath>
#include <random>
#include <string>

#include "idem/circuit_breaker.hpp"
#include "idem/error.hpp"
#include "idem/validation.hpp"

namespace idem {

std::chrono::nanoseconds Backoff::delay(int retry, double u) const noexcept {
  if (base <= std::chrono::nanoseconds::zero()) return std::chrono::nanoseconds::zero();
  if (retry < 1) retry = 1;
  if (!(u >= 0.0)) u = 0.0;  // also catches NaN
  if (u >= 1.0) u = std::nextafter(1.0, 0.0);
  const double cap_ns = static_cast<double>(cap.count());
  // Grow in floating point and clamp before converting, so a large retry number cannot overflow.
  double nominal = static_cast<double>(base.count()) * std::pow(multiplier, retry - 1);
  if (!(nominal <= cap_ns)) nominal = cap_ns;
  const double jittered = nominal * (1.0 - jitter * u);
  return std::chrono::nanoseconds(static_cast<std::int64_t>(jittered));
}

void Backoff::validate(std::string_view owner) const {
  const std::string who(owner);
  if (base < std::chrono::nanoseconds::zero()) {
    throw ConfigError(who + ": backoff.base must be >= 0");
  }
  if (!(multiplier >= 1.0) || !std::isfinite(multiplier)) {
    throw ConfigError(who + ": backoff.multiplier must be a finite number >= 1, got " +
                      std::to_string(multiplier));
  }
  if (cap < base) throw ConfigError(who + ": backoff.cap must be >= backoff.base");
  if (!(jitter >= 0.0 && jitter <= 1.0)) {
    throw ConfigError(who + ": backoff.jitter must be within [0, 1] (1 = full jitter), got " +
                      std::to_string(jitter));
  }
}

double default_random() noexcept {
  thread_local std::mt19937_64 engine{[] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
}

bool default_retry_on(const std::exception& error) noexcept {
  if (const auto* idem_error = dynamic_cast<const Error*>(&error)) {
    return idem_error->retryable() || idem_error->in_doubt();
  }
  return true;
}

void RetryPolicy::validate(std::string_view owner) const {
  if (max_attempts < 1) {
    throw ConfigError(std::string(owner) + ": retry max_attempts must be >= 1, got " +
                      std::to_string(max_attempts));
  }
  backoff.validate(owner);
}

bool RetryPolicy::should_retry(const std::exception_ptr& error) const noexcept {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const ValidationError&) {
    return retry_invalid_results;
  } catch (const CircuitOpenError&) {
    return false;
  } catch (const InvalidArgument&) {
    return false;
  } catch (const ReentryError&) {
    return false;
  } catch (const KeyReuseError&) {
    return false;
  } catch (const Cancelled&) {
    return false;
  } catch (const std::exception& e) {
    const auto* idem_error = dynamic_cast<const Error*>(&e);
    if (idem_error != nullptr && idem_error->in_doubt() && !retry_in_doubt) return false;
    if (retry_on) {
      try {
        return retry_on(e);
      } catch (...) {
        return false;  // a broken predicate must not turn into a retry storm
      }
    }
    return default_retry_on(e);
  } catch (...) {
    return false;  // not a std::exception: nothing tells us retrying is safe
  }
}

}  // namespace idem
