#include "idem/circuit_breaker.hpp"

#include <string>
#include <utility>

namespace idem {
namespace {

std::string describe_retry_after(std::chrono::nanoseconds retry_after) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(retry_after).count();
  return std::to_string(ms) + " ms";
}

}  // namespace

std::string_view to_string(CircuitState state) noexcept {
  switch (state) {
    case CircuitState::closed:
      return "closed";
    case CircuitState::open:
      return "open";
    case CircuitState::half_open:
      return "half_open";
  }
  return "unknown";
}

CircuitOpenError::CircuitOpenError(std::string breaker, CircuitState state,
                                   std::chrono::nanoseconds retry_after)
    : Error(ErrorCode::circuit_open,
            "circuit breaker '" + breaker + "' is " + std::string(to_string(state)) +
                (state == CircuitState::half_open
                     ? "; a probe call is running"
                     : "; next probe in " + describe_retry_after(retry_after)),
            /*retryable=*/true),
      breaker_(std::move(breaker)),
      state_(state),
      retry_after_(retry_after) {}

bool CircuitBreaker::records(const std::exception& failure) const {
  return !options_.record_failure_on || options_.record_failure_on(failure);
}

CircuitBreaker::CircuitBreaker(CircuitBreakerOptions options) : options_(std::move(options)) {
  if (options_.name.find_first_not_of(" \t") == std::string::npos) {
    throw ConfigError("circuit breaker: name must not be empty");
  }
  if (options_.failure_threshold < 1) {
    throw ConfigError("circuit breaker '" + options_.name +
                      "': failure_threshold must be >= 1, got " +
                      std::to_string(options_.failure_threshold));
  }
  if (options_.recovery_time <= std::chrono::nanoseconds::zero()) {
    throw ConfigError("circuit breaker '" + options_.name + "': recovery_time must be positive");
  }
  if (!options_.clock) options_.clock = system_clock();
}

CircuitBreaker::Permit CircuitBreaker::acquire() {
  std::optional<CircuitTransition> transition;
  bool probe = false;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    switch (state_) {
      case CircuitState::closed:
        break;
      case CircuitState::open: {
        const SteadyTime now = options_.clock->steady_now();
        const SteadyTime probe_at = *opened_at_ + options_.recovery_time;
        if (now < probe_at) {
          throw CircuitOpenError(
              options_.name, CircuitState::open,
              std::chrono::duration_cast<std::chrono::nanoseconds>(probe_at - now));
        }
        transition = move_to_locked(CircuitState::half_open, now);
        probe_in_flight_ = true;
        probe = true;
        break;
      }
      case CircuitState::half_open:
        if (probe_in_flight_) {
          throw CircuitOpenError(options_.name, CircuitState::half_open,
                                 std::chrono::nanoseconds::zero());
        }
        // The previous probe ended without an outcome; this caller probes instead.
        probe_in_flight_ = true;
        probe = true;
        break;
    }
    generation = generation_;
  }
  notify(transition);
  return Permit(this, generation, probe, transition);
}

CircuitSnapshot CircuitBreaker::snapshot() const {
  std::lock_guard lock(mutex_);
  CircuitSnapshot out;
  out.state = state_;
  out.consecutive_failures = consecutive_failures_;
  out.opened_at = opened_at_;
  if (state_ == CircuitState::open) {
    const SteadyTime now = options_.clock->steady_now();
    const SteadyTime probe_at = *opened_at_ + options_.recovery_time;
    if (now < probe_at) {
      out.retry_after = std::chrono::duration_cast<std::chrono::nanoseconds>(probe_at - now);
    }
  }
  return out;
}

void CircuitBreaker::reset() {
  std::optional<CircuitTransition> transition;
  {
    std::lock_guard lock(mutex_);
    if (state_ != CircuitState::closed) {
      transition = move_to_locked(CircuitState::closed, options_.clock->steady_now());
    } else {
      ++generation_;  // in-flight outcomes from before the reset no longer count
    }
    consecutive_failures_ = 0;
    probe_in_flight_ = false;
  }
  notify(transition);
}

CircuitTransition CircuitBreaker::move_to_locked(CircuitState next, SteadyTime now) {
  const CircuitTransition transition{state_, next};
  state_ = next;
  ++generation_;
  if (next == CircuitState::open) opened_at_ = now;
  if (next == CircuitState::closed) {
    opened_at_.reset();
    consecutive_failures_ = 0;
  }
  return transition;
}

std::optional<CircuitTransition> CircuitBreaker::finish(std::uint64_t generation, bool probe,
                                                        Outcome outcome) {
  std::optional<CircuitTransition> transition;
  {
    std::lock_guard lock(mutex_);
    if (generation != generation_) return std::nullopt;  // admitted under an earlier state
    if (probe) {
      probe_in_flight_ = false;
      if (outcome == Outcome::success) {
        transition = move_to_locked(CircuitState::closed, options_.clock->steady_now());
      } else if (outcome == Outcome::failure) {
        transition = move_to_locked(CircuitState::open, options_.clock->steady_now());
      }
    } else if (state_ == CircuitState::closed) {
      if (outcome == Outcome::success) {
        consecutive_failures_ = 0;
      } else if (outcome == Outcome::failure &&
                 ++consecutive_failures_ >= options_.failure_threshold) {
        transition = move_to_locked(CircuitState::open, options_.clock->steady_now());
      }
    }
  }
  notify(transition);
  return transition;
}

void CircuitBreaker::notify(const std::optional<CircuitTransition>& transition) const {
  if (!transition || !options_.on_state_change) return;
  try {
    options_.on_state_change(*transition);
  } catch (...) {
    // An observer's failure must not turn into the guarded call's failure.
  }
}

CircuitBreaker::Permit::Permit(Permit&& other) noexcept
    : breaker_(std::exchange(other.breaker_, nullptr)),
      generation_(other.generation_),
      probe_(other.probe_),
      admitted_(other.admitted_) {}

CircuitBreaker::Permit& CircuitBreaker::Permit::operator=(Permit&& other) noexcept {
  if (this != &other) {
    ignore();
    breaker_ = std::exchange(other.breaker_, nullptr);
    generation_ = other.generation_;
    probe_ = other.probe_;
    admitted_ = other.admitted_;
  }
  return *this;
}

CircuitBreaker::Permit::~Permit() {
  ignore();
}

std::optional<CircuitTransition> CircuitBreaker::Permit::succeeded() {
  auto* breaker = std::exchange(breaker_, nullptr);
  if (breaker == nullptr) return std::nullopt;
  return breaker->finish(generation_, probe_, Outcome::success);
}

std::optional<CircuitTransition> CircuitBreaker::Permit::failed() {
  auto* breaker = std::exchange(breaker_, nullptr);
  if (breaker == nullptr) return std::nullopt;
  return breaker->finish(generation_, probe_, Outcome::failure);
}

void CircuitBreaker::Permit::ignore() noexcept {
  auto* breaker = std::exchange(breaker_, nullptr);
  if (breaker == nullptr) return;
  try {
    breaker->finish(generation_, probe_, Outcome::ignored);
  } catch (...) {
    // finish() only throws if locking fails; a destructor must not.
  }
}

}  // namespace idem
