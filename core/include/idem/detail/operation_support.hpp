// Internal: the non-template half of the resilient-operation engine.
//
// The typed engine (operation_engine.hpp) only invokes the user's functions; everything else —
// the report, retry decisions and backoff waits, breaker bookkeeping, events, the final error —
// lives here, compiled once in idem::core, so every operation type shares it.
//
// Thread-safety: PolicyCore is immutable once built and shared by every call. A Lifecycle
// belongs to one call on one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/circuit_breaker.hpp"
#include "idem/clock.hpp"
#include "idem/events.hpp"
#include "idem/fallback.hpp"
#include "idem/observer.hpp"
#include "idem/rate_limit.hpp"
#include "idem/report.hpp"
#include "idem/retry.hpp"

namespace idem::detail {

// The demangled name of a type_info name.
std::string demangle(const char* mangled);

struct FailureInfo {
  std::string type{};     // demangled dynamic type ("int" for `throw 42`)
  std::string message{};  // what(), or a note for non-std exceptions
  AttemptStatus status = AttemptStatus::failed;
  bool retryable = false;
  bool counts_for_breaker = true;                     // bad input, re-entrancy, cancellation do not
  std::string validator{};                            // set for a ValidationError
  std::string reason{};                               // set for a ValidationError
  std::optional<std::chrono::nanoseconds> timeout{};  // set for an attempt's TimeoutError
};

// Describes a failed attempt. `retry` null: the attempt is never retried (fallbacks).
FailureInfo describe_failure(const std::exception_ptr& error, const RetryPolicy* retry);

// The policies shared by every call of one operation (no types of the user's function).
struct PolicyCore {
  std::string name = "operation";
  RetryPolicy retry{.max_attempts = 1};
  std::optional<std::chrono::nanoseconds> timeout{};
  // After a timeout's stop request, how long the caller waits for the attempt to end.
  std::chrono::nanoseconds timeout_grace{0};
  std::shared_ptr<CircuitBreaker> breaker{};
  RateLimitPolicy rate_limit{};
  // Which failures start the fallbacks and let the chain go on to the next candidate (relprim's
  // FallbackPolicy); empty: every failure.
  FailurePredicate fallback_on{};
  std::vector<std::shared_ptr<EventSink>> sinks{};
  std::shared_ptr<Observer> observer{};   // null: calls are not observed (one null check)
  std::shared_ptr<Clock> clock_option{};  // as configured (may be null)
  // Set by the typed spec before resolve(), for events and report metadata.
  std::vector<std::string> validator_names{};
  bool idempotency_enabled = false;

  // Resolved by resolve():
  std::shared_ptr<Clock> clock{};  // never null
  EventEmitter events{};
  std::vector<std::string> fallback_sources{};  // "fallback:<name or position>"
  std::shared_ptr<std::mutex> random_mutex{};   // serialises a user random source

  // Checks name, retry and timeout (ConfigError) and resolves the fields above.
  void resolve(const std::vector<std::string>& fallback_names);
  // A jitter draw in [0, 1).
  double draw() const noexcept;
};

// Tells core.observer how a call that started at `started` (core.clock's steady time) ended:
// `report` is a success's (its idempotency_status tells joined and replayed apart); null means
// the call threw the exception being handled (call it from a catch block).
void observe_call(const PolicyCore& core, SteadyTime started, bool keyed,
                  const ExecutionReport* report) noexcept;

// Bookkeeping for one call: the report, events, breaker permits, retry decisions.
class Lifecycle {
 public:
  explicit Lifecycle(const PolicyCore& core);

  // Emits attempt.started and asks the breaker. False: the breaker rejected the attempt (it is
  // recorded) and the primary gives up.
  bool start_attempt(int attempt, CircuitBreaker::Permit& permit);
  void attempt_succeeded(int attempt, CircuitBreaker::Permit& permit);
  // Records the failure; when it is retried (true) the backoff has already been waited out
  // (clock->sleep_for).
  bool attempt_failed(int attempt, CircuitBreaker::Permit& permit, std::exception_ptr error);
  // The same record and decision, without the wait: the delay to wait before the retry, or
  // nullopt when the primary gives up. For callers that wait on their own (the async face's
  // timers).
  std::optional<std::chrono::nanoseconds> retry_delay_after(int attempt,
                                                            CircuitBreaker::Permit& permit,
                                                            std::exception_ptr error);
  // The caller cancelled the call (the async face: its cancellation slot fired). `attempt` > 0:
  // that attempt was running and is recorded as cancelled (the breaker ignores it); 0: the call
  // was between attempts. No retry and no fallback follows; fail() then reports `cancelled`
  // with `error` as the cause.
  void cancelled(int attempt, CircuitBreaker::Permit* permit, std::exception_ptr error);

  // Whether the primary's last failure starts the fallback chain (fallback_on).
  bool falls_back() const;
  // Why the primary gave up, for fallbacks. Valid until the Lifecycle ends.
  const FallbackContext& fallback_context();
  // A result passed every validator (primary or fallback; `source` for the event).
  void validation_succeeded(int attempt, std::string_view source);
  void fallback_started(std::size_t index);
  void fallback_succeeded(std::size_t index);
  // Records a fallback's failure. True: the chain goes on to the next candidate; false: fallback_on
  // does not accept this failure, so the chain stops and fail() reports it as the cause.
  bool fallback_failed(std::size_t index, std::exception_ptr error);

  // Completes the report as a success (the report is moved out).
  ExecutionReport succeed();
  // Completes the report as a failure and throws OperationError with the cause nested.
  [[noreturn]] void fail();

 private:
  void emit(EventType type, int attempt, std::map<std::string, std::string> fields) const;
  void emit_transition(const std::optional<CircuitTransition>& transition, int attempt) const;
  // What the rate-limit policy made of one primary attempt (its rate_limit* metadata).
  struct RateLimitNote {
    bool rate_limited = false;
    std::optional<std::chrono::nanoseconds> retry_after{};  // the provider's delay
    std::optional<std::chrono::nanoseconds> delay{};        // the wait chosen before a retry
    DelaySource source = DelaySource::backoff;
    bool wait_exceeded = false;  // `delay` was too long: nothing was waited
  };

  void record_failure(int attempt, std::string source, const FailureInfo& info);
  // Writes the rate_limit* metadata every primary attempt carries (relprim's keys), and keeps
  // `note` as the primary's last for the report.
  void note_rate_limit(AttemptRecord& record, const RateLimitNote& note);
  void note_validation(const FailureInfo& info);
  // Whether fallback_on accepts `error` (a failure it cannot test is not accepted).
  bool accepts_fallback(const std::exception_ptr& error) const;
  // Whether rate_limit_on calls `error` a rate limit (a throwing predicate: no).
  bool is_rate_limit(const std::exception_ptr& error) const;
  // The rate-limit policy's decision on a failed primary attempt that rate_limit_on accepted:
  // the wait before the retry, or nullopt when the retries end (final_error_ then says why). An
  // extractor that fails replaces the attempt's failure (`info`) with the
  // RetryAfterExtractionError, which is not a rate limit.
  std::optional<std::chrono::nanoseconds> rate_limited_retry(int attempt,
                                                             const std::exception_ptr& error,
                                                             bool last_attempt, FailureInfo& info,
                                                             RateLimitNote& note);
  // Report metadata shared by succeed() and fail().
  void finish_metadata();
  // The status of a finished call from its last attempt.
  OperationStatus final_status() const;

  const PolicyCore& core_;
  ExecutionReport report_{};
  SteadyTime started_{};
  SteadyTime attempt_started_{};
  std::optional<SteadyTime> ended_{};  // when the successful attempt ended
  int primary_attempts_ = 0;
  std::exception_ptr last_error_{};
  std::string last_type_{};
  std::string last_message_{};
  // Replaces last_error_ as the operation's cause (RateLimitWaitExceeded,
  // RetryAfterExtractionError); fallbacks still see last_error_.
  std::exception_ptr final_error_{};
  WallTime attempt_started_wall_{};
  bool validation_performed_ = false;
  std::string validator_{};  // the validator that rejected the last failed result
  std::string validation_reason_{};
  bool breaker_rejected_ = false;  // the last primary failure was a breaker rejection
  bool fallback_ran_ = false;      // a fallback was called
  bool fallback_stopped_ = false;  // fallback_on refused a fallback's failure: it is the cause
  bool cancelled_ = false;         // the caller cancelled the call (cancelled())
  bool rate_limit_encountered_ = false;
  bool rate_limit_wait_exceeded_ = false;
  std::chrono::nanoseconds rate_limit_wait_{0};
  RateLimitNote last_rate_limit_{};  // the primary's last attempt's
  // Timed-out attempts (index into report_.attempts, the TimeoutError) for attempt_stopped.
  std::vector<std::pair<std::size_t, std::exception_ptr>> timeouts_{};
  std::vector<FallbackFailure> fallback_failures_{};
  FallbackContext fallback_context_{};
};

}  // namespace idem::detail
