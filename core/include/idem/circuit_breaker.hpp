// CircuitBreaker: stop calling a dependency that keeps failing, and probe it now and then.
//
// A consecutive-failure breaker with three states:
//   closed    — calls pass; `failure_threshold` failures in a row open it (a success resets the
//               count);
//   open      — calls are rejected with CircuitOpenError (retry_after = time until the next
//               probe) until `recovery_time` has passed since it opened;
//   half_open — exactly one call (the probe) passes; every other caller is rejected while it
//               runs. The probe's success closes the breaker, its failure opens it again.
// A call's outcome counts only for the state it was admitted in: results of calls admitted
// before a transition are ignored, so a slow call admitted while closed cannot close a breaker
// that has since opened.
//
// The breaker is a plain state machine over an injected Clock (steady time), so tests drive it
// with idem::testing::ManualClock. Resilient operations use it through acquire() and the
// Permit it returns; anything else may too:
//
//   auto permit = breaker->acquire();          // throws CircuitOpenError when rejected
//   try { call(); permit.succeeded(); } catch (...) { permit.failed(); throw; }
//
// A Permit that is dropped without an outcome counts as neither (a probe slot is freed).
//
// Thread-safety: safe to share between threads and between operations (std::shared_ptr).
// State-change callbacks run on the thread that caused the change, after the breaker's lock is
// released, so they may call back into the breaker; callbacks from different threads are not
// serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/error.hpp"

namespace idem {

enum class CircuitState { closed, open, half_open };

// "closed", "open", "half_open".
std::string_view to_string(CircuitState state) noexcept;

struct CircuitTransition {
  CircuitState from = CircuitState::closed;
  CircuitState to = CircuitState::closed;
};

struct CircuitBreakerOptions {
  // Name used in errors and events. Default "circuit_breaker".
  std::string name = "circuit_breaker";
  // Consecutive failures that open the breaker. At least 1. Default 5.
  int failure_threshold = 5;
  // How long the breaker stays open before it lets one probe through. Positive. Default 30 s.
  std::chrono::nanoseconds recovery_time = std::chrono::seconds(30);
  // Steady time source. Default: the system clock.
  std::shared_ptr<Clock> clock{};
  // Called on every state change (see the thread-safety note above). Default: none.
  std::function<void(const CircuitTransition&)> on_state_change{};
  // Which failures of a resilient operation's attempts count toward opening; any other failure
  // counts as neither success nor failure (a probe slot is freed). Called concurrently. Default:
  // empty = every failure except the caller's own (bad input, re-entry, cancellation).
  std::function<bool(const std::exception&)> record_failure_on{};
};

// A call rejected by an open (or probing) breaker. retryable(): the same call may pass after
// retry_after(). Resilient operations never retry it themselves: the rejection ends the retries.
class CircuitOpenError : public Error {
 public:
  CircuitOpenError(std::string breaker, CircuitState state, std::chrono::nanoseconds retry_after);

  const std::string& breaker() const noexcept { return breaker_; }
  CircuitState state() const noexcept { return state_; }
  // Time until the breaker lets the next probe through. Zero while a probe is running: its
  // outcome decides.
  std::chrono::nanoseconds retry_after() const noexcept { return retry_after_; }

 private:
  std::string breaker_{};
  CircuitState state_{};
  std::chrono::nanoseconds retry_after_{};
};

struct CircuitSnapshot {
  CircuitState state = CircuitState::closed;
  int consecutive_failures = 0;
  std::optional<SteadyTime> opened_at{};    // when it last opened; set while open or half-open
  std::chrono::nanoseconds retry_after{0};  // while open: time until a probe may pass
};

class CircuitBreaker {
 public:
  // Throws ConfigError for an empty name, failure_threshold < 1 or recovery_time <= 0.
  explicit CircuitBreaker(CircuitBreakerOptions options = {});
  CircuitBreaker(const CircuitBreaker&) = delete;
  CircuitBreaker& operator=(const CircuitBreaker&) = delete;

  // Admission for one call. Move-only; report the outcome once with succeeded() or failed().
  class Permit {
   public:
    Permit() = default;  // an empty permit: no breaker, outcomes do nothing
    Permit(Permit&& other) noexcept;
    Permit& operator=(Permit&& other) noexcept;
    Permit(const Permit&) = delete;
    Permit& operator=(const Permit&) = delete;
    ~Permit();

    // Each returns the state change it caused, if any.
    std::optional<CircuitTransition> succeeded();
    std::optional<CircuitTransition> failed();
    // Neither success nor failure (e.g. the caller's own bad input); frees a probe slot.
    void ignore() noexcept;

    bool is_probe() const noexcept { return probe_; }
    // The change that admitting this call caused (open -> half_open for a probe), if any.
    std::optional<CircuitTransition> admission_transition() const noexcept { return admitted_; }

   private:
    friend class CircuitBreaker;
    Permit(CircuitBreaker* breaker, std::uint64_t generation, bool probe,
           std::optional<CircuitTransition> admitted) noexcept
        : breaker_(breaker), generation_(generation), probe_(probe), admitted_(admitted) {}

    CircuitBreaker* breaker_ = nullptr;
    std::uint64_t generation_ = 0;
    bool probe_ = false;
    std::optional<CircuitTransition> admitted_;
  };

  // Admits a call or throws CircuitOpenError. The permit must not outlive the breaker.
  Permit acquire();

  CircuitSnapshot snapshot() const;
  CircuitState state() const { return snapshot().state; }
  const std::string& name() const noexcept { return options_.name; }
  // Whether a failure counts toward opening (CircuitBreakerOptions::record_failure_on).
  bool records(const std::exception& failure) const;

  // Back to closed with no failures counted; in-flight calls' outcomes are then ignored.
  void reset();

 private:
  enum class Outcome { success, failure, ignored };
  std::optional<CircuitTransition> finish(std::uint64_t generation, bool probe, Outcome outcome);
  // Must hold mutex_. Returns the transition for the callback.
  CircuitTransition move_to_locked(CircuitState next, SteadyTime now);
  void notify(const std::optional<CircuitTransition>& transition) const;

  CircuitBreakerOptions options_{};
  mutable std::mutex mutex_{};
  CircuitState state_ = CircuitState::closed;
  int consecutive_failures_ = 0;
  std::optional<SteadyTime> opened_at_{};
  bool probe_in_flight_ = false;
  std::uint64_t generation_ = 0;  // bumped on every transition
};

}  // namespace idem
