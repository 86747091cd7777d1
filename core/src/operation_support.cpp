#include "idem/detail/operation_support.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <typeinfo>
#include <utility>

#include "idem/error.hpp"
#include "idem/operation_result.hpp"
#include "idem/timeout.hpp"
#include "idem/validation.hpp"

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

namespace detail {

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
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr) info.status = AttemptStatus::timed_out;
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
         {{"max_attempts", std::to_string(core.retry.max_attempts)}});
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
  record.duration = core_.clock->steady_now() - attempt_started_;
  record.error_type = info.type;
  record.error_message = info.message;
  record.retryable = info.retryable;
  report_.attempts.push_back(std::move(record));
}

bool Lifecycle::start_attempt(int attempt, CircuitBreaker::Permit& permit) {
  if (core_.events.enabled()) emit(EventType::attempt_started, attempt, {{"source", "primary"}});
  // Clock reads are most of a plain call's cost; the first attempt starts with the operation.
  attempt_started_ = attempt == 1 ? started_ : core_.clock->steady_now();
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
    ++primary_attempts_;
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
  record.duration = *ended_ - attempt_started_;
  report_.attempts.push_back(std::move(record));
  ++primary_attempts_;
  if (core_.events.enabled()) {
    emit(EventType::attempt_succeeded, attempt,
         {{"source", "primary"}, {"duration_ms", millis_text(report_.attempts.back().duration)}});
  }
}

bool Lifecycle::attempt_failed(int attempt, CircuitBreaker::Permit& permit,
                               std::exception_ptr error) {
  const FailureInfo info = describe_failure(error, &core_.retry);
  if (info.counts_for_breaker) {
    emit_transition(permit.failed(), attempt);
  } else {
    permit.ignore();
  }
  record_failure(attempt, "primary", info);
  ++primary_attempts_;
  last_error_ = std::move(error);
  last_type_ = info.type;
  last_message_ = info.message;
  if (core_.events.enabled()) {
    if (!info.validator.empty()) {
      emit(EventType::validation_failed, attempt,
           {{"source", "primary"}, {"validator", info.validator}, {"reason", info.reason}});
    }
    emit(EventType::attempt_failed, attempt,
         {{"source", "primary"},
          {"status", std::string(to_string(info.status))},
          {"error_type", info.type},
          {"error", info.message},
          {"retryable", info.retryable ? "true" : "false"}});
  }
  if (!info.retryable || attempt >= core_.retry.max_attempts) return false;
  const auto delay = core_.retry.backoff.delay(attempt, core_.draw());
  if (core_.events.enabled()) {
    emit(EventType::retry_scheduled, attempt,
         {{"delay_ms", millis_text(delay)},
          {"delay_ns", std::to_string(delay.count())},
          {"next_attempt", std::to_string(attempt + 1)}});
  }
  core_.clock->sleep_for(delay);
  return true;
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
  if (core_.events.enabled()) {
    emit(EventType::fallback_started, 0, {{"fallback", core_.fallback_sources[index]}});
  }
  attempt_started_ = core_.clock->steady_now();
}

void Lifecycle::fallback_succeeded(std::size_t index) {
  const std::string& source = core_.fallback_sources[index];
  ended_ = core_.clock->steady_now();
  AttemptRecord record;
  record.number = static_cast<int>(report_.attempts.size()) + 1;
  record.source = source;
  record.duration = *ended_ - attempt_started_;
  report_.attempts.push_back(std::move(record));
  report_.fallback_used = true;
  report_.fallback_source = source;
  if (core_.events.enabled()) {
    emit(EventType::fallback_succeeded, 0,
         {{"fallback", source}, {"duration_ms", millis_text(report_.attempts.back().duration)}});
  }
}

void Lifecycle::fallback_failed(std::size_t index, std::exception_ptr error) {
  const std::string& source = core_.fallback_sources[index];
  const FailureInfo info = describe_failure(error, nullptr);
  record_failure(static_cast<int>(report_.attempts.size()) + 1, source, info);
  if (core_.events.enabled()) {
    if (!info.validator.empty()) {
      emit(EventType::validation_failed, 0,
           {{"source", source}, {"validator", info.validator}, {"reason", info.reason}});
    }
    emit(EventType::fallback_failed, 0,
         {{"fallback", source}, {"error_type", info.type}, {"error", info.message}});
  }
  fallback_failures_.push_back({source, info.type, info.message, std::move(error)});
}

ExecutionReport Lifecycle::succeed() {
  report_.status = OperationStatus::succeeded;
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
  report_.status = OperationStatus::failed;
  report_.duration = core_.clock->steady_now() - started_;
  std::exception_ptr cause = last_error_;
  std::string cause_type = last_type_;
  std::string cause_message = last_message_;
  if (fallback_failures_.size() > 1) {
    FallbackChainError chain(std::move(fallback_failures_));
    cause_type = demangle(typeid(chain).name());
    cause_message = chain.what();
    cause = std::make_exception_ptr(std::move(chain));
  }
  if (core_.events.enabled()) {
    emit(EventType::operation_failed, 0,
         {{"attempts", std::to_string(report_.attempts.size())},
          {"duration_ms", millis_text(report_.duration)},
          {"error_type", cause_type},
          {"error", cause_message}});
  }
  throw_operation_error(std::move(report_), std::move(cause));
}

}  // namespace detail
}  // namespace idem
