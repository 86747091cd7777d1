#include "idem/events.hpp"

#include <nlohmann/json.hpp>

#include <ostream>

#include "idem/error.hpp"
#include "iso_time.hpp"

namespace idem {
namespace {

// A switch, so that -Wswitch flags a new EventType without a name.
constexpr std::string_view name_of(EventType type) noexcept {
  switch (type) {
    case EventType::operation_started:
      return "operation.started";
    case EventType::operation_succeeded:
      return "operation.succeeded";
    case EventType::operation_failed:
      return "operation.failed";
    case EventType::attempt_started:
      return "attempt.started";
    case EventType::attempt_succeeded:
      return "attempt.succeeded";
    case EventType::attempt_failed:
      return "attempt.failed";
    case EventType::retry_scheduled:
      return "retry.scheduled";
    case EventType::circuit_breaker_rejected:
      return "circuit_breaker.rejected";
    case EventType::circuit_breaker_state_changed:
      return "circuit_breaker.state_changed";
    case EventType::fallback_started:
      return "fallback.started";
    case EventType::fallback_succeeded:
      return "fallback.succeeded";
    case EventType::fallback_failed:
      return "fallback.failed";
    case EventType::validation_failed:
      return "validation.failed";
    case EventType::idempotency_executed:
      return "idempotency.executed";
    case EventType::idempotency_joined:
      return "idempotency.joined";
    case EventType::idempotency_replayed:
      return "idempotency.replayed";
    case EventType::idempotency_rejected:
      return "idempotency.rejected";
    case EventType::idempotency_takeover:
      return "idempotency.takeover";
    case EventType::validation_succeeded:
      return "validation.succeeded";
    case EventType::rate_limit_detected:
      return "rate_limit.detected";
    case EventType::rate_limit_wait_exceeded:
      return "rate_limit.wait_exceeded";
  }
  return {};
}

constexpr std::array<std::string_view, kEventTypeCount> kNames = [] {
  std::array<std::string_view, kEventTypeCount> names{};
  for (std::size_t i = 0; i < kEventTypeCount; ++i)
    names[i] = name_of(static_cast<EventType>(i));
  return names;
}();
static_assert(static_cast<std::size_t>(EventType::rate_limit_wait_exceeded) + 1 == kEventTypeCount,
              "kEventTypeCount must follow EventType");
static_assert(!kNames.back().empty(), "every EventType needs a name");

std::atomic<std::uint64_t> g_sink_failures{0};

}  // namespace

std::string_view to_string(EventType type) noexcept {
  const auto index = static_cast<std::size_t>(type);
  return index < kNames.size() ? kNames[index] : std::string_view("unknown");
}

std::optional<EventType> event_type_from_string(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<EventType>(i);
  }
  return std::nullopt;
}

std::string OperationEvent::to_json() const {
  nlohmann::json out = {{"type", to_string(type)},
                        {"operation", operation},
                        {"time", detail::format_iso8601(time)},
                        {"attempt", attempt},
                        {"fields", fields}};
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::uint64_t event_sink_failures() noexcept {
  return g_sink_failures.load();
}

void InMemoryEventSink::emit(const OperationEvent& event) {
  std::lock_guard lock(mutex_);
  events_.push_back(event);
}

std::vector<OperationEvent> InMemoryEventSink::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

std::vector<EventType> InMemoryEventSink::types() const {
  std::lock_guard lock(mutex_);
  std::vector<EventType> out;
  out.reserve(events_.size());
  for (const auto& event : events_)
    out.push_back(event.type);
  return out;
}

std::size_t InMemoryEventSink::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

void InMemoryEventSink::clear() {
  std::lock_guard lock(mutex_);
  events_.clear();
}

void JsonLinesEventSink::emit(const OperationEvent& event) {
  const std::string line = event.to_json();
  std::lock_guard lock(mutex_);
  out_ << line << '\n';
  out_.flush();
}

CallbackEventSink::CallbackEventSink(std::function<void(const OperationEvent&)> callback)
    : callback_(std::move(callback)) {
  if (!callback_) throw InvalidArgument("CallbackEventSink: the callback is empty");
}

void CountingEventSink::emit(const OperationEvent& event) noexcept {
  const auto index = static_cast<std::size_t>(event.type);
  if (index < counts_.size()) counts_[index].fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t CountingEventSink::count(EventType type) const noexcept {
  const auto index = static_cast<std::size_t>(type);
  return index < counts_.size() ? counts_[index].load(std::memory_order_relaxed) : 0;
}

std::uint64_t CountingEventSink::total() const noexcept {
  std::uint64_t sum = 0;
  for (const auto& count : counts_)
    sum += count.load(std::memory_order_relaxed);
  return sum;
}

std::map<std::string, std::uint64_t> CountingEventSink::counts() const {
  std::map<std::string, std::uint64_t> out;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    out.emplace(std::string(kNames[i]), counts_[i].load(std::memory_order_relaxed));
  }
  return out;
}

std::string CountingEventSink::scrape() const {
  std::string out =
      "# HELP idem_events_total Structured events emitted by idem resilient operations.\n"
      "# TYPE idem_events_total counter\n";
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    out += "idem_events_total{type=\"";
    out += kNames[i];
    out += "\"} ";
    out += std::to_string(counts_[i].load(std::memory_order_relaxed));
    out += '\n';
  }
  return out;
}

EventEmitter::EventEmitter(std::vector<std::shared_ptr<EventSink>> sinks)
    : sinks_(std::move(sinks)) {
  for (const auto& sink : sinks_) {
    if (!sink) throw ConfigError("events: a sink is null");
  }
}

void EventEmitter::emit(const OperationEvent& event) const noexcept {
  for (const auto& sink : sinks_) {
    try {
      sink->emit(event);
    } catch (...) {
      // A broken sink must never break the operation it observes.
      g_sink_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

}  // namespace idem
