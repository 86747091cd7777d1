// Structured events of resilient operations, and the sinks that receive them.
//
// Every resilient operation (idem::resilient, idem::operation) can report what it does as a stream
// of OperationEvent values: operation.started/succeeded/failed, attempt.started/succeeded/failed,
// retry.scheduled, circuit_breaker.rejected/state_changed, fallback.started/succeeded/failed,
// validation.succeeded/failed, rate_limit.detected/wait_exceeded and
// idempotency.executed/joined/replayed/rejected/takeover. Each event carries
// its type, the operation name, the wall time (from the operation's clock), the attempt number (0
// when the event belongs to no attempt) and a string field map (key, status, delay_ms, error, ...).
//
// Sinks are injected (ResilientOptions::events, Operation::with_events). Four are provided:
//   * InMemoryEventSink   — keeps every event; for tests.
//   * JsonLinesEventSink  — writes one JSON object per line to a std::ostream.
//   * CallbackEventSink   — calls a function.
//   * CountingEventSink   — counters by event type, with a text format a metrics system scrapes.
//
// Guarantees: a sink that throws never breaks the operation. The exception is swallowed and
// counted (event_sink_failures()), and the remaining sinks still get the event. Operations with
// no sinks build no events at all.
//
// Thread-safety: every sink here is safe to share between threads and operations. A user sink
// must be too, since one operation may be called from many threads at once.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"

namespace idem {

enum class EventType {
  operation_started,
  operation_succeeded,
  operation_failed,
  attempt_started,
  attempt_succeeded,
  attempt_failed,
  retry_scheduled,
  circuit_breaker_rejected,
  circuit_breaker_state_changed,
  fallback_started,
  fallback_succeeded,
  fallback_failed,
  validation_failed,
  idempotency_executed,
  idempotency_joined,
  idempotency_replayed,
  idempotency_rejected,
  idempotency_takeover,
  validation_succeeded,
  rate_limit_detected,
  rate_limit_wait_exceeded,
};

// Number of EventType values (they are dense, starting at 0).
inline constexpr std::size_t kEventTypeCount = 21;

// The dotted name, e.g. "retry.scheduled".
std::string_view to_string(EventType type) noexcept;
// The inverse of to_string; nullopt for an unknown name.
std::optional<EventType> event_type_from_string(std::string_view name) noexcept;

struct OperationEvent {
  EventType type = EventType::operation_started;
  std::string operation{};                      // the operation's name
  WallTime time{};                              // wall time from the operation's clock
  int attempt = 0;                              // attempt number; 0 when not about one attempt
  std::map<std::string, std::string> fields{};  // event-specific details, see docs/resilience.md

  // {"type":..,"operation":..,"time":"<ISO-8601 UTC>","attempt":n,"fields":{..}}
  std::string to_json() const;
};

class EventSink {
 public:
  virtual ~EventSink() = default;
  // May throw; the operation swallows and counts the exception.
  virtual void emit(const OperationEvent& event) = 0;
};

// How many exceptions sinks have thrown (and idem swallowed) in this process.
std::uint64_t event_sink_failures() noexcept;

// Keeps every event in arrival order.
class InMemoryEventSink final : public EventSink {
 public:
  void emit(const OperationEvent& event) override;

  std::vector<OperationEvent> events() const;
  std::vector<EventType> types() const;  // just the types, in order
  std::size_t size() const;
  void clear();

 private:
  mutable std::mutex mutex_{};
  std::vector<OperationEvent> events_{};
};

// One JSON object (OperationEvent::to_json) per line. Lines from concurrent emitters never
// interleave. The stream must outlive the sink; each line is flushed.
class JsonLinesEventSink final : public EventSink {
 public:
  explicit JsonLinesEventSink(std::ostream& out) : out_(out) {}
  void emit(const OperationEvent& event) override;

 private:
  std::mutex mutex_{};
  std::ostream& out_;
};

// Calls a function for every event (concurrently, from the operations' threads).
class CallbackEventSink final : public EventSink {
 public:
  // Throws InvalidArgument when `callback` is empty.
  explicit CallbackEventSink(std::function<void(const OperationEvent&)> callback);
  void emit(const OperationEvent& event) override { callback_(event); }

 private:
  std::function<void(const OperationEvent&)> callback_;
};

// Lock-free counters by event type.
class CountingEventSink final : public EventSink {
 public:
  void emit(const OperationEvent& event) noexcept override;

  std::uint64_t count(EventType type) const noexcept;
  std::uint64_t total() const noexcept;
  // Every type with its count (zeros included), keyed by the dotted name.
  std::map<std::string, std::uint64_t> counts() const;
  // Prometheus text exposition format:  idem_events_total{type="retry.scheduled"} 3
  std::string scrape() const;

 private:
  std::array<std::atomic<std::uint64_t>, kEventTypeCount> counts_{};
};

// Delivers events to a fixed list of sinks, swallowing (and counting) whatever they throw.
// Copies share the sinks. Cheap to test for emptiness, so callers build events only when needed.
class EventEmitter {
 public:
  EventEmitter() = default;
  // Throws ConfigError when a sink is null.
  explicit EventEmitter(std::vector<std::shared_ptr<EventSink>> sinks);

  bool enabled() const noexcept { return !sinks_.empty(); }
  void emit(const OperationEvent& event) const noexcept;

 private:
  std::vector<std::shared_ptr<EventSink>> sinks_{};
};

}  // namespace idem
