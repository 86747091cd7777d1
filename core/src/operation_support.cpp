#include "idem/detail/operation_support.hpp"

#include "idem/detail/operation_engine.hpp"

#include <cxxabi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>

#include "idem/circuit_breaker.hpp"
#include "idem/error.hpp"
#include "idem/idempotency.hpp"
#include "idem/key.hpp"
#include "idem/observer.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/operation_result.hpp"
#include "idem/timeout.hpp"
#include "idem/validation.hpp"
#include "idempotency_metadata.hpp"

namespace idem {

OperationError::OperationError(const std::string& message, ExecutionReport report, bool retryable,
                               bool in_doubt)
    : Error(ErrorCode::operation_failed, message, retryable, in_doubt),
      report_(std::move(report)) {}

namespace {

struct Flags {
  bool retryable = false;
  bool in_doubt = false;
};

// An exception's own view of whether trying again later may help.
Flags flags_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return {e.retryable(), e.in_doubt()};
  } catch (const std::exception&) {
    return {true, false};
  } catch (...) {
    return {};
  }
}

std::string join_failures(const std::vector<FallbackFailure>& failures) {
  std::string out = "every fallback failed";
  for (const auto& failure : failures) {
    out += "; ";
    out += failure.source;
    out += ": ";
    out += failure.error_message;
  }
  return out;
}

std::string millis_text(std::chrono::nanoseconds duration) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(duration).count());
}

// Seconds as a short decimal: "2", "2.5", "0.001".
std::string seconds_text(std::chrono::nanoseconds duration) {
  // Whole seconds (every report's "0") without printf, as %.9g prints them.
  constexpr std::int64_t kBillion = 1'000'000'000;
  if (duration.count() >= 0 && duration.count() % kBillion == 0 &&
      duration.count() / kBillion < kBillion) {
    return std::to_string(duration.count() / kBillion);
  }
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(duration.count()) / 1e9);
  return buffer;
}

const char* flag(bool value) {
  return value ? "true" : "false";
}

// The report keys every call writes (operation_support.hpp's Lifecycle::finish_metadata and
// note_rate_limit), built once: most are longer than a string holds without allocating, and
// written in key order with hinted inserts (as the idempotency keys are, DESIGN-NOTES §66).
struct ReportKeys {
  const std::string circuit_breaker_open = "circuit_breaker_open";
  const std::string fallback_failed = "fallback_failed";
  const std::string fallback_failure_count = "fallback_failure_count";
  const std::string fallback_used = "fallback_used";
  const std::string rate_limit_delay_seconds = "rate_limit_delay_seconds";
  const std::string rate_limit_delay_source = "rate_limit_delay_source";
  const std::string rate_limit_encountered = "rate_limit_encountered";
  const std::string rate_limit_retry_after_seconds = "rate_limit_retry_after_seconds";
  const std::string rate_limit_wait_exceeded = "rate_limit_wait_exceeded";
  const std::string rate_limit_wait_seconds = "rate_limit_wait_seconds";
  const std::string rate_limited = "rate_limited";
  const std::string reason = "reason";
  const std::string valid = "valid";
  const std::string validation_performed = "validation_performed";
  const std::string validation_reason = "validation_reason";
  const std::string validation_valid = "validation_valid";
  const std::string validation_validator_name = "validation_validator_name";
  const std::string validator_name = "validator_name";
};

const ReportKeys& report_keys() {
  // Never destroyed: calls may still run while static objects are torn down.
  static const ReportKeys* const keys = new ReportKeys();
  return *keys;
}

}  // namespace

FallbackChainError::FallbackChainError(std::vector<FallbackFailure> failures)
    : Error(
          ErrorCode::fallback_chain_failed, join_failures(failures),
          !failures.empty() && failures.front().error && flags_of(failures.front().error).retryable,
          !failures.empty() && failures.front().error && flags_of(failures.front().error).in_doubt),
      failures_(std::move(failures)) {}

void throw_operation_error(ExecutionReport report, std::exception_ptr cause) {
  if (!cause)
    cause = std::make_exception_ptr(Error(ErrorCode::operation_failed, "unknown failure"));
  const Flags flags = flags_of(cause);
  std::string message = "operation '" + report.operation + "' failed after " +
                        std::to_string(report.attempts.size()) + " attempt(s): ";
  try {
    std::rethrow_exception(cause);
  } catch (const std::exception& e) {
    message += e.what();
  } catch (...) {
    message += "a non-standard exception";
  }
  try {
    std::rethrow_exception(cause);
  } catch (...) {
    // Constructed while `cause` is being handled, so std::nested_exception captures it.
    throw OperationError(message, std::move(report), flags.retryable, flags.in_doubt);
  }
}

std::string scoped_idempotency_key(std::string_view scope, std::string_view key) {
  if (scope.empty()) return std::string(key);
  // "<scope length>:<scope>:<key>", built in one allocation.
  char digits[20];
  std::size_t n = 0;
  std::size_t length = scope.size();
  do {
    digits[n++] = static_cast<char>('0' + length % 10);
    length /= 10;
  } while (length > 0);
  std::string out;
  out.reserve(n + scope.size() + key.size() + 2);
  while (n > 0)
    out += digits[--n];
  out += ':';
  out += scope;
  out += ':';
  out += key;
  return out;
}

std::optional<ScopedIdempotencyKey> split_scoped_idempotency_key(std::string_view stored) noexcept {
  std::size_t length = 0;
  std::size_t i = 0;
  // Digits of the scope's length, without a leading zero (a scope is never empty).
  for (; i < stored.size() && stored[i] >= '0' && stored[i] <= '9'; ++i) {
    if (i == 0 && stored[i] == '0') return std::nullopt;
    if (i >= 3) return std::nullopt;  // a key is at most 255 bytes
    length = length * 10 + static_cast<std::size_t>(stored[i] - '0');
  }
  if (i == 0 || i >= stored.size() || stored[i] != ':') return std::nullopt;
  const std::size_t scope_at = i + 1;
  if (length == 0 || stored.size() < scope_at + length + 1 || stored[scope_at + length] != ':') {
    return std::nullopt;
  }
  return ScopedIdempotencyKey{stored.substr(scope_at, length),
                              stored.substr(scope_at + length + 1)};
}

namespace detail {

std::string next_anonymous_scope() {
  static std::atomic<std::uint64_t> counter{0};
  return "operation#" + std::to_string(counter.fetch_add(1, std::memory_order_relaxed) + 1);
}

std::string resolve_scope(const std::string& who, const std::string& name,
                          const std::optional<std::string>& scope,
                          const std::string& anonymous_scope, bool durable) {
  std::string resolved;
  if (scope) {
    resolved = *scope;
  } else if (!anonymous_scope.empty()) {
    if (durable) {
      throw ConfigError(who +
                        ": idempotency keys are scoped by the operation's name, and a store "
                        "that outlives the process needs a stable one: give the operation a "
                        "name or an idempotency scope");
    }
    resolved = anonymous_scope;
  } else {
    resolved = name;
  }
  if (resolved.empty()) return resolved;
  // The prefix must leave room for at least a one-byte key.
  const std::size_t prefix = scoped_idempotency_key(resolved, "").size();
  if (prefix + 1 > kMaxKeyLength) {
    throw ConfigError(who + ": idempotency scope is " + std::to_string(resolved.size()) +
                      " bytes; with its prefix it leaves no room for a key within " +
                      std::to_string(kMaxKeyLength) + " bytes");
  }
  try {
    validate_key("idempotency scope", resolved);
  } catch (const InvalidKey& e) {
    throw ConfigError(who + ": " + e.what());
  }
  return resolved;
}

std::string scoped_key_for(const std::string& operation, const std::string& scope,
                           const std::string& key) {
  validate_key("idempotency key", key);
  std::string scoped = scoped_idempotency_key(scope, key);
  if (scoped.size() > kMaxKeyLength) {
    const std::size_t prefix = scoped.size() - key.size();
    throw InvalidKey(
        "idempotency key of operation '" + operation + "' is too long with its scope '" + scope +
        "': " + std::to_string(key.size()) + " bytes of key + " + std::to_string(prefix) +
        " bytes of scope prefix, at most " + std::to_string(kMaxKeyLength) + " together");
  }
  return scoped;
}

void rethrow_idempotency_rejection(const PolicyCore& core, const std::string& user_key) {
  try {
    throw;
  } catch (const AlreadyInProgress&) {
    emit_idempotency_event(core, EventType::idempotency_rejected, user_key, "already_in_progress");
    throw;
  } catch (const KeyReuseError&) {
    // The coordinator named the caller's key and the operation (IdempotentCall::caller_key).
    emit_idempotency_event(core, EventType::idempotency_rejected, user_key, "key_reuse");
    throw;
  } catch (const ReentryError&) {
    emit_idempotency_event(core, EventType::idempotency_rejected, user_key, "reentry");
    throw;
  }
}

void note_idempotent_outcome(const PolicyCore& core, CoordinatedResult& outcome,
                             const std::string& user_key, const std::string& scope,
                             const std::string& stored_key) {
  if (outcome.took_over) {
    // This caller executed after an owner whose lease ran out; that owner's work may have run.
    emit_idempotency_event(core, EventType::idempotency_takeover, user_key, {});
  }
  if (outcome.status == IdempotencyStatus::joined) {
    emit_idempotency_event(core, EventType::idempotency_joined, user_key, {});
  } else if (outcome.status == IdempotencyStatus::replayed) {
    emit_idempotency_event(core, EventType::idempotency_replayed, user_key, {});
  }
  // The report speaks of the caller's key; the store holds it scoped. The coordinator has written
  // idempotency_key (overwritten in place here); the three are written in key order from one
  // search (see set_metadata_after).
  const detail::MetadataKeys& keys = detail::metadata_keys();
  auto& metadata = outcome.report.metadata;
  auto at = metadata.lower_bound(keys.key);
  at = detail::set_metadata_after(metadata, at, keys.key, user_key);
  at = detail::set_metadata_after(metadata, at, keys.scope, scope);
  detail::set_metadata_after(metadata, at, keys.stored_key, stored_key);
}

std::string demangle(const char* mangled) {
  if (mangled == nullptr) return "unknown";
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || readable == nullptr) return mangled;
  std::string out(readable);
  std::free(readable);
  return out;
}

FailureInfo describe_failure(const std::exception_ptr& error, const RetryPolicy* retry) {
  FailureInfo info;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    info.type = demangle(typeid(e).name());
    info.message = e.what();
    if (const auto* timeout = dynamic_cast<const TimeoutError*>(&e)) {
      info.status = AttemptStatus::timed_out;
      info.timeout = timeout->timeout();
    }
    if (dynamic_cast<const Cancelled*>(&e) != nullptr) info.status = AttemptStatus::cancelled;
    if (const auto* invalid = dynamic_cast<const ValidationError*>(&e)) {
      info.validator = invalid->validator();
      info.reason = invalid->reason();
    }
    // The dependency is not at fault for these, so they do not move the breaker.
    info.counts_for_breaker = dynamic_cast<const InvalidArgument*>(&e) == nullptr &&
                              dynamic_cast<const ReentryError*>(&e) == nullptr &&
                              dynamic_cast<const KeyReuseError*>(&e) == nullptr &&
                              dynamic_cast<const Cancelled*>(&e) == nullptr &&
                              dynamic_cast<const CircuitOpenError*>(&e) == nullptr;
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    info.type = type != nullptr ? demangle(type->name()) : "unknown";
    info.message = "non-standard exception of type " + info.type;
  }
  info.retryable = retry != nullptr && retry->should_retry(error);
  return info;
}

void PolicyCore::resolve(const std::vector<std::string>& fallback_names) {
  if (name.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw ConfigError("resilient operation: name must not be empty");
  }
  const std::string who = "operation '" + name + "'";
  retry.validate(who);
  if (timeout && *timeout <= std::chrono::nanoseconds::zero()) {
    throw ConfigError(who + ": timeout must be positive");
  }
  if (timeout_grace < std::chrono::nanoseconds::zero()) {
    throw ConfigError(who + ": timeout_grace must be >= 0");
  }
  rate_limit.validate(who);
  for (const auto& sink : sinks) {
    if (!sink) throw ConfigError(who + ": an event sink is null");
  }
  clock = clock_option ? clock_option : system_clock();
  events = EventEmitter(sinks);
  fallback_sources.clear();
  for (std::size_t i = 0; i < fallback_names.size(); ++i) {
    fallback_sources.push_back(
        "fallback:" + (fallback_names[i].empty() ? std::to_string(i + 1) : fallback_names[i]));
  }
  random_mutex = retry.random ? std::make_shared<std::mutex>() : nullptr;
}

double PolicyCore::draw() const noexcept {
  if (!retry.random) return default_random();
  try {
    std::lock_guard lock(*random_mutex);
    return retry.random();
  } catch (...) {
    return 0.0;  // a broken random source gets the undithered delay
  }
}

void emit_idempotency_event(const PolicyCore& core, EventType type, const std::string& key,
                            std::string_view reason) {
  if (!core.events.enabled()) return;
  OperationEvent event;
  event.type = type;
  event.operation = core.name;
  event.time = core.clock->wall_now();
  event.fields.emplace("key", key);
  std::string_view status = to_string(type);
  status.remove_prefix(std::string_view("idempotency.").size());
  event.fields.emplace("status", std::string(status));
  if (!reason.empty()) event.fields.emplace("reason", std::string(reason));
  core.events.emit(event);
}

namespace {

// What a call that threw `error` came to, for observers.
CallOutcome call_outcome_of(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const OperationError& e) {
    if (e.report().status == OperationStatus::timed_out) return CallOutcome::timed_out;
    if (e.report().status == OperationStatus::cancelled) return CallOutcome::cancelled;
    try {
      if (e.cause()) std::rethrow_exception(e.cause());
    } catch (const CircuitOpenError&) {
      return CallOutcome::rejected_circuit_open;
    } catch (const RateLimitWaitExceeded&) {
      return CallOutcome::rejected_rate_limit;
    } catch (...) {
    }
    return CallOutcome::failed;
  } catch (const KeyReuseError&) {
    return CallOutcome::rejected_key_reuse;
  } catch (const AlreadyInProgress&) {
    return CallOutcome::rejected_in_progress;
  } catch (const TimeoutError&) {
    return CallOutcome::timed_out;  // a waiter's deadline
  } catch (const Cancelled&) {
    return CallOutcome::cancelled;  // a waiter's stop
  } catch (...) {
  }
  return CallOutcome::error;
}

}  // namespace

void observe_call(const PolicyCore& core, SteadyTime started, bool keyed,
                  const ExecutionReport* report) noexcept {
  if (!core.observer) return;
  CallObservation observation;
  observation.operation = core.name;
  observation.keyed = keyed;
  if (report != nullptr) {
    observation.outcome = CallOutcome::executed;
    if (keyed) {
      const auto it = report->metadata.find(detail::metadata_keys().status);
      if (it != report->metadata.end()) {
        if (it->second == to_string(IdempotencyStatus::joined)) {
          observation.outcome = CallOutcome::joined;
        } else if (it->second == to_string(IdempotencyStatus::replayed)) {
          observation.outcome = CallOutcome::replayed;
        }
      }
    }
  } else {
    observation.outcome = call_outcome_of(std::current_exception());
  }
  try {
    observation.duration = core.clock->steady_now() - started;
  } catch (...) {
    // A clock that throws leaves the duration at zero.
  }
  detail::notify(*core.observer, observation);
}

void check_idempotency_settings(const std::string& operation, Millis ttl, Millis lease,
                                Millis max_wait) {
  const std::string who = "operation '" + operation + "'";
  if (ttl <= Millis::zero()) throw ConfigError(who + ": idempotency ttl must be positive");
  if (lease <= Millis::zero()) throw ConfigError(who + ": idempotency lease must be positive");
  if (max_wait < Millis::zero()) throw ConfigError(who + ": idempotency max wait must be >= 0");
}

Lifecycle::Lifecycle(const PolicyCore& core) : core_(core) {
  report_.operation = core.name;
  report_.started_at = core.clock->wall_now();
  started_ = core.clock->steady_now();
  report_.attempts.reserve(static_cast<std::size_t>(core.retry.max_attempts) +
                           core.fallback_sources.size());
  if (core_.events.enabled()) {
    emit(EventType::operation_started, 0,
         {{"max_attempts", std::to_string(core.retry.max_attempts)},
          {"retry_enabled", flag(core.retry.max_attempts > 1)},
          {"timeout_enabled", flag(core.timeout.has_value())},
          {"circuit_breaker_enabled", flag(core.breaker != nullptr)},
          {"validation_enabled", flag(!core.validator_names.empty())},
          {"fallback_enabled", flag(!core.fallback_sources.empty())},
          {"rate_limit_enabled", flag(core.rate_limit.enabled())},
          {"idempotency_enabled", flag(core.idempotency_enabled)}});
  }
}

void Lifecycle::emit(EventType type, int attempt, std::map<std::string, std::string> fields) const {
  OperationEvent event;
  event.type = type;
  event.operation = core_.name;
  event.time = core_.clock->wall_now();
  event.attempt = attempt;
  event.fields = std::move(fields);
  core_.events.emit(event);
}

void Lifecycle::emit_transition(const std::optional<CircuitTransition>& transition,
                                int attempt) const {
  if (!transition || !core_.events.enabled()) return;
  emit(EventType::circuit_breaker_state_changed, attempt,
       {{"breaker", core_.breaker->name()},
        {"from", std::string(to_string(transition->from))},
        {"to", std::string(to_string(transition->to))}});
}

void Lifecycle::record_failure(int attempt, std::string source, const FailureInfo& info) {
  AttemptRecord record;
  record.number = attempt;
  record.source = std::move(source);
  record.status = info.status;
  record.started_at = attempt_started_wall_;
  record.duration = core_.clock->steady_now() - attempt_started_;
  record.error_type = info.type;
  record.error_message = info.message;
  record.retryable = info.retryable;
  if (!info.validator.empty()) {
    // relprim's keys, and idem's own names kept beside them.
    record.metadata.emplace("validation_valid", "false");
    record.metadata.emplace("validation_validator_name", info.validator);
    record.metadata.emplace("validation_reason", info.reason);
    record.metadata.emplace("validator_name", info.validator);
    record.metadata.emplace("reason", info.reason);
  }
  if (info.timeout) {
    record.metadata.emplace("timeout_seconds", seconds_text(*info.timeout));
    record.metadata.emplace("stop_requested", "true");
  }
  report_.attempts.push_back(std::move(record));
}

bool Lifecycle::start_attempt(int attempt, CircuitBreaker::Permit& permit) {
  if (core_.events.enabled()) emit(EventType::attempt_started, attempt, {{"source", "primary"}});
  // Clock reads are most of a plain call's cost; the first attempt starts with the operation.
  attempt_started_ = attempt == 1 ? started_ : core_.clock->steady_now();
  attempt_started_wall_ = attempt == 1 ? report_.started_at : core_.clock->wall_now();
  if (!core_.breaker) return true;
  try {
    permit = core_.breaker->acquire();
  } catch (const CircuitOpenError& rejection) {
    FailureInfo info;
    info.type = demangle(typeid(rejection).name());
    info.message = rejection.what();
    info.status = AttemptStatus::rejected;
    info.counts_for_breaker = false;
    record_failure(attempt, "primary", info);
    note_rate_limit(report_.attempts.back(), {});
    ++primary_attempts_;
    breaker_rejected_ = true;
    last_error_ = std::current_exception();
    last_type_ = info.type;
    last_message_ = info.message;
    if (core_.events.enabled()) {
      emit(EventType::circuit_breaker_rejected, attempt,
           {{"breaker", rejection.breaker()},
            {"state", std::string(to_string(rejection.state()))},
            {"retry_after_ms", millis_text(rejection.retry_after())}});
      emit(EventType::attempt_failed, attempt,
           {{"source", "primary"},
            {"status", "rejected"},
            {"error_type", info.type},
            {"error", info.message},
            {"retryable", "false"}});
    }
    return false;
  }
  emit_transition(permit.admission_transition(), attempt);
  return true;
}

void Lifecycle::attempt_succeeded(int attempt, CircuitBreaker::Permit& permit) {
  emit_transition(permit.succeeded(), attempt);
  ended_ = core_.clock->steady_now();
  AttemptRecord record;
  record.number = attempt;
  record.started_at = attempt_started_wall_;
  record.duration = *ended_ - attempt_started_;
  note_rate_limit(record, {});
  report_.attempts.push_back(std::move(record));
  ++primary_attempts_;
  breaker_rejected_ = false;
  if (core_.events.enabled()) {
    emit(EventType::attempt_succeeded, attempt,
         {{"source", "primary"}, {"duration_ms", millis_text(report_.attempts.back().duration)}});
  }
}

bool Lifecycle::attempt_failed(int attempt, CircuitBreaker::Permit& permit,
                               std::exception_ptr error) {
  const auto delay = retry_delay_after(attempt, permit, std::move(error));
  if (!delay) return false;
  core_.clock->sleep_for(*delay);
  return true;
}

void Lifecycle::cancelled(int attempt, CircuitBreaker::Permit* permit, std::exception_ptr error) {
  cancelled_ = true;
  final_error_ = error;
  if (attempt <= 0) return;
  if (permit != nullptr) permit->ignore();
  FailureInfo info = describe_failure(error, nullptr);
  info.status = AttemptStatus::cancelled;
  note_validation(info);
  record_failure(attempt, "primary", info);
  note_rate_limit(report_.attempts.back(), {});
  ++primary_attempts_;
  last_error_ = error;
  last_type_ = info.type;
  last_message_ = info.message;
  if (core_.events.enabled()) {
    emit(EventType::attempt_failed, attempt,
         {{"source", "primary"},
          {"status", std::string(to_string(info.status))},
          {"error_type", info.type},
          {"error", info.message},
          {"retryable", "false"},
          {"rate_limited", "false"}});
  }
}

void Lifecycle::note_rate_limit(AttemptRecord& record, const RateLimitNote& note) {
  last_rate_limit_ = note;
  // In key order from the first rate_limit* key, so each insert's hint holds.
  const ReportKeys& keys = report_keys();
  auto& metadata = record.metadata;
  auto at = metadata.lower_bound(keys.rate_limit_delay_seconds);
  if (note.delay && !note.wait_exceeded) {
    at = set_metadata_after(metadata, at, keys.rate_limit_delay_seconds, seconds_text(*note.delay));
  }
  at = set_metadata_after(metadata, at, keys.rate_limit_delay_source, to_string(note.source));
  if (note.retry_after) {
    at = set_metadata_after(metadata, at, keys.rate_limit_retry_after_seconds,
                            seconds_text(*note.retry_after));
  }
  at = set_metadata_after(metadata, at, keys.rate_limit_wait_exceeded, flag(note.wait_exceeded));
  set_metadata_after(metadata, at, keys.rate_limited, flag(note.rate_limited));
}

bool Lifecycle::is_rate_limit(const std::exception_ptr& error) const {
  if (!core_.rate_limit.enabled()) return false;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    try {
      return core_.rate_limit.rate_limit_on(e);
    } catch (...) {
      return false;  // a broken predicate does not make a rate limit
    }
  } catch (...) {
    return false;
  }
}

std::optional<std::chrono::nanoseconds> Lifecycle::retry_delay_after(int attempt,
                                                                     CircuitBreaker::Permit& permit,
                                                                     std::exception_ptr error) {
  FailureInfo info = describe_failure(error, &core_.retry);
  bool recorded_by_breaker = info.counts_for_breaker;
  if (recorded_by_breaker && core_.breaker) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      recorded_by_breaker = core_.breaker->records(e);
    } catch (...) {
    }
  }
  if (recorded_by_breaker) {
    emit_transition(permit.failed(), attempt);
  } else {
    permit.ignore();
  }
  breaker_rejected_ = false;
  last_error_ = error;
  last_type_ = info.type;
  last_message_ = info.message;
  final_error_ = nullptr;
  const bool last_attempt = attempt >= core_.retry.max_attempts;
  // The decision comes first: relprim reports the rate limit before the failed attempt.
  RateLimitNote note;
  std::optional<std::chrono::nanoseconds> delay;
  if (is_rate_limit(error)) {
    delay = rate_limited_retry(attempt, error, last_attempt, info, note);
  } else if (info.retryable && !last_attempt) {
    delay = core_.retry.backoff.delay(attempt, core_.draw());
  }
  note_validation(info);
  record_failure(attempt, "primary", info);
  note_rate_limit(report_.attempts.back(), note);
  if (info.timeout) timeouts_.emplace_back(report_.attempts.size() - 1, error);
  ++primary_attempts_;
  if (!core_.events.enabled()) return delay;
  if (!info.validator.empty()) {
    emit(EventType::validation_failed, attempt,
         {{"source", "primary"},
          {"validator", info.validator},
          {"validator_name", info.validator},
          {"reason", info.reason}});
  }
  if (note.rate_limited) {
    std::map<std::string, std::string> fields{{"error_type", info.type}};
    if (note.retry_after) fields.emplace("retry_after_seconds", seconds_text(*note.retry_after));
    emit(EventType::rate_limit_detected, attempt, std::move(fields));
  }
  if (note.wait_exceeded) {
    emit(EventType::rate_limit_wait_exceeded, attempt,
         {{"delay_seconds", seconds_text(*note.delay)},
          {"delay_source", std::string(to_string(note.source))},
          {"max_wait_seconds", seconds_text(core_.rate_limit.max_wait)}});
  }
  emit(EventType::attempt_failed, attempt,
       {{"source", "primary"},
        {"status", std::string(to_string(info.status))},
        {"error_type", info.type},
        {"error", info.message},
        {"retryable", flag(info.retryable)},
        {"rate_limited", flag(note.rate_limited)}});
  if (delay) {
    std::map<std::string, std::string> fields{{"delay_ms", millis_text(*delay)},
                                              {"delay_ns", std::to_string(delay->count())},
                                              {"delay_seconds", seconds_text(*delay)},
                                              {"delay_source", std::string(to_string(note.source))},
                                              {"rate_limited", flag(note.rate_limited)},
                                              {"next_attempt", std::to_string(attempt + 1)}};
    if (note.retry_after) fields.emplace("retry_after_seconds", seconds_text(*note.retry_after));
    emit(EventType::retry_scheduled, attempt, std::move(fields));
  }
  return delay;
}

std::optional<std::chrono::nanoseconds> Lifecycle::rate_limited_retry(
    int attempt, const std::exception_ptr& error, bool last_attempt, FailureInfo& info,
    RateLimitNote& note) {
  std::optional<std::chrono::nanoseconds> retry_after;
  if (core_.rate_limit.retry_after) {
    std::exception_ptr extractor_error;
    bool bad_value = false;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      try {
        retry_after = core_.rate_limit.retry_after(e);
        if (retry_after && *retry_after < std::chrono::nanoseconds::zero()) bad_value = true;
      } catch (...) {
        extractor_error = std::current_exception();
      }
    } catch (...) {
    }
    if (extractor_error || bad_value) {
      std::string why = "the retry-after extractor ";
      if (extractor_error) {
        why += "threw";
        try {
          std::rethrow_exception(extractor_error);
        } catch (const std::exception& e) {
          why += ": ";
          why += e.what();
        } catch (...) {
        }
      } else {
        why += "returned a negative delay (" + seconds_text(*retry_after) + " s)";
      }
      final_error_ = std::make_exception_ptr(
          RetryAfterExtractionError("operation '" + core_.name + "', attempt " +
                                        std::to_string(attempt) + ": rate limited, and " + why,
                                    error, extractor_error));
      // The attempt failed with the extraction error, as in relprim (fallbacks, fallback_on and
      // the breaker still see the rate-limited failure itself).
      info = describe_failure(final_error_, nullptr);
      return std::nullopt;
    }
  }
  rate_limit_encountered_ = true;
  info.retryable = true;  // a rate limit is retried whatever retry_on says: the wait decides
  note.rate_limited = true;
  note.retry_after = retry_after;
  note.source = retry_after ? DelaySource::provider : DelaySource::backoff;
  if (last_attempt) {
    info.retryable = false;
    return std::nullopt;
  }
  const auto delay = retry_after ? *retry_after : core_.retry.backoff.delay(attempt, core_.draw());
  note.delay = delay;
  if (delay > core_.rate_limit.max_wait) {
    note.wait_exceeded = true;
    rate_limit_wait_exceeded_ = true;
    info.retryable = false;
    final_error_ = std::make_exception_ptr(RateLimitWaitExceeded(
        "operation '" + core_.name + "', attempt " + std::to_string(attempt) +
            ": rate limited, and the wait before a retry (" + seconds_text(delay) +
            " s, from the " + std::string(to_string(note.source)) +
            ") is longer than max_rate_limit_wait (" + seconds_text(core_.rate_limit.max_wait) +
            " s): " + last_message_,
        delay, core_.rate_limit.max_wait, error));
    return std::nullopt;
  }
  rate_limit_wait_ += delay;
  return delay;
}

bool Lifecycle::falls_back() const {
  return !last_error_ || accepts_fallback(last_error_);
}

bool Lifecycle::accepts_fallback(const std::exception_ptr& error) const {
  if (!core_.fallback_on) return true;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    try {
      return core_.fallback_on(e);
    } catch (...) {
      return false;
    }
  } catch (...) {
    return false;  // a non-standard exception cannot be tested: it propagates
  }
}

void Lifecycle::validation_succeeded(int attempt, std::string_view source) {
  validation_performed_ = true;
  validator_.clear();
  validation_reason_.clear();
  if (core_.events.enabled()) {
    std::string names;
    for (const auto& name : core_.validator_names) {
      if (!names.empty()) names += ",";
      names += name;
    }
    emit(EventType::validation_succeeded, attempt,
         {{"source", std::string(source)}, {"validator_name", std::move(names)}});
  }
}

const FallbackContext& Lifecycle::fallback_context() {
  if (fallback_failures_.empty()) {
    fallback_failures_.push_back({"primary", last_type_, last_message_, last_error_});
  }
  fallback_context_.error = last_error_;
  fallback_context_.error_type = last_type_;
  fallback_context_.error_message = last_message_;
  fallback_context_.primary_attempts = primary_attempts_;
  return fallback_context_;
}

void Lifecycle::fallback_started(std::size_t index) {
  fallback_ran_ = true;
  report_.fallback_used = true;
  if (core_.events.enabled()) {
    emit(EventType::fallback_started, 0,
         {{"fallback", core_.fallback_sources[index]},
          {"fallback_candidate_index", std::to_string(index)},
          {"after_primary_attempts", std::to_string(primary_attempts_)}});
  }
  attempt_started_ = core_.clock->steady_now();
  attempt_started_wall_ = core_.clock->wall_now();
}

void Lifecycle::fallback_succeeded(std::size_t index) {
  const std::string& source = core_.fallback_sources[index];
  ended_ = core_.clock->steady_now();
  AttemptRecord record;
  record.number = static_cast<int>(report_.attempts.size()) + 1;
  record.source = source;
  record.started_at = attempt_started_wall_;
  record.duration = *ended_ - attempt_started_;
  report_.attempts.push_back(std::move(record));
  report_.fallback_source = source;
  report_.metadata["fallback_candidate_name"] = source.substr(std::string_view("fallback:").size());
  report_.metadata["fallback_candidate_index"] = std::to_string(index);
  if (core_.events.enabled()) {
    emit(EventType::fallback_succeeded, 0,
         {{"fallback", source}, {"duration_ms", millis_text(report_.attempts.back().duration)}});
  }
}

// The last failure decides the report's validation metadata: a rejected result names its
// validator and reason, any other failure clears them.
void Lifecycle::note_validation(const FailureInfo& info) {
  if (!info.validator.empty()) {
    validation_performed_ = true;
    validator_ = info.validator;
    validation_reason_ = info.reason;
  } else {
    validator_.clear();
    validation_reason_.clear();
  }
}

bool Lifecycle::fallback_failed(std::size_t index, std::exception_ptr error) {
  const std::string& source = core_.fallback_sources[index];
  const FailureInfo info = describe_failure(error, nullptr);
  record_failure(static_cast<int>(report_.attempts.size()) + 1, source, info);
  note_validation(info);
  if (core_.events.enabled()) {
    if (!info.validator.empty()) {
      emit(EventType::validation_failed, 0,
           {{"source", source},
            {"validator", info.validator},
            {"validator_name", info.validator},
            {"reason", info.reason}});
    }
    emit(EventType::fallback_failed, 0,
         {{"fallback", source}, {"error_type", info.type}, {"error", info.message}});
  }
  // relprim's FallbackChain: a failure fallback_on does not accept stops the chain.
  fallback_stopped_ = !accepts_fallback(error);
  fallback_failures_.push_back({source, info.type, info.message, std::move(error)});
  return !fallback_stopped_;
}

void Lifecycle::finish_metadata() {
  // Every key in ascending order from one search (the fallback_candidate_* keys written earlier
  // and the idempotency_* keys written later sort between them).
  const ReportKeys& keys = report_keys();
  auto& metadata = report_.metadata;
  auto at = metadata.lower_bound(keys.circuit_breaker_open);
  const auto put = [&](const std::string& key, std::string_view value) {
    at = set_metadata_after(metadata, at, key, value);
  };
  // The call ended on the breaker's rejection: a fallback that ran (rescued or not) ended it.
  put(keys.circuit_breaker_open, flag(breaker_rejected_ && !fallback_ran_));
  if (fallback_ran_) put(keys.fallback_failed, flag(!report_.fallback_source));
  if (!core_.fallback_sources.empty()) {
    const std::size_t failed = fallback_failures_.empty() ? 0 : fallback_failures_.size() - 1;
    put(keys.fallback_failure_count, std::to_string(failed));
  }
  put(keys.fallback_used, flag(fallback_ran_));
  // The rate-limit summary, on every report; rate_limited and the provider's delay are the
  // primary's last attempt's.
  put(keys.rate_limit_encountered, flag(rate_limit_encountered_));
  if (last_rate_limit_.retry_after) {
    put(keys.rate_limit_retry_after_seconds, seconds_text(*last_rate_limit_.retry_after));
  }
  put(keys.rate_limit_wait_exceeded, flag(rate_limit_wait_exceeded_));
  put(keys.rate_limit_wait_seconds, seconds_text(rate_limit_wait_));
  put(keys.rate_limited, flag(last_rate_limit_.rate_limited));
  // relprim's validation_* keys, and idem's own names (valid, validator_name, reason) beside.
  const bool succeeded = report_.status == OperationStatus::succeeded;
  const bool rejected = validation_performed_ && !succeeded && !validator_.empty();
  std::string names;
  if (validation_performed_ && succeeded) {
    for (const auto& name : core_.validator_names) {
      if (!names.empty()) names += ",";
      names += name;
    }
  }
  const bool valid = validation_performed_ && succeeded;
  if (rejected) put(keys.reason, validation_reason_);
  if (valid || rejected) put(keys.valid, flag(valid));
  put(keys.validation_performed, flag(validation_performed_));
  if (rejected) put(keys.validation_reason, validation_reason_);
  if (valid || rejected) {
    put(keys.validation_valid, flag(valid));
    put(keys.validation_validator_name, valid ? names : validator_);
    put(keys.validator_name, valid ? names : validator_);
  }
  // Whether each timed-out attempt has ended by the time the call ends.
  for (const auto& [index, error] : timeouts_) {
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError& timeout) {
      if (const auto stopped = timeout.attempt_stopped()) {
        report_.attempts[index].metadata["attempt_stopped"] = flag(*stopped);
      }
    } catch (...) {
    }
  }
}

OperationStatus Lifecycle::final_status() const {
  if (cancelled_) return OperationStatus::cancelled;
  if (report_.attempts.empty()) return OperationStatus::failed;
  switch (report_.attempts.back().status) {
    case AttemptStatus::timed_out:
      return OperationStatus::timed_out;
    case AttemptStatus::cancelled:
      return OperationStatus::cancelled;
    default:
      return OperationStatus::failed;
  }
}

ExecutionReport Lifecycle::succeed() {
  report_.status = OperationStatus::succeeded;
  finish_metadata();
  report_.duration = (ended_ ? *ended_ : core_.clock->steady_now()) - started_;
  if (core_.events.enabled()) {
    std::map<std::string, std::string> fields{
        {"attempts", std::to_string(report_.attempts.size())},
        {"duration_ms", millis_text(report_.duration)},
        {"fallback_used", report_.fallback_used ? "true" : "false"}};
    if (report_.fallback_source) fields.emplace("fallback", *report_.fallback_source);
    emit(EventType::operation_succeeded, 0, std::move(fields));
  }
  return std::move(report_);
}

void Lifecycle::fail() {
  report_.status = final_status();
  report_.duration = core_.clock->steady_now() - started_;
  finish_metadata();
  std::exception_ptr cause = final_error_ ? final_error_ : last_error_;
  std::string cause_type = last_type_;
  std::string cause_message = last_message_;
  if (fallback_stopped_) {
    // relprim raises the failure that stopped the chain as it is.
    FallbackFailure& stopped = fallback_failures_.back();
    cause = stopped.error;
    cause_type = std::move(stopped.error_type);
    cause_message = std::move(stopped.error_message);
  } else if (fallback_failures_.size() > 1) {
    FallbackChainError chain(std::move(fallback_failures_));
    cause_type = demangle(typeid(chain).name());
    cause_message = chain.what();
    cause = std::make_exception_ptr(std::move(chain));
  }
  if (final_error_ && fallback_failures_.size() <= 1) {
    try {
      std::rethrow_exception(final_error_);
    } catch (const std::exception& e) {
      cause_type = demangle(typeid(e).name());
      cause_message = e.what();
    }
  }
  if (core_.events.enabled()) {
    emit(EventType::operation_failed, 0,
         {{"status", std::string(to_string(report_.status))},
          {"attempts", std::to_string(report_.attempts.size())},
          {"duration_ms", millis_text(report_.duration)},
          {"error_type", cause_type},
          {"error", cause_message}});
  }
  throw_operation_error(std::move(report_), std::move(cause));
}

}  // namespace detail
}  // namespace idem
