// ExecutionReport: what happened during one resilient operation.
//
// Every call through idem::resilient / idem::operation produces a report: overall status, when
// it started and how long it took, every attempt (primary and fallbacks), whether a fallback ran
// and which one produced the result, and a string metadata map (idempotency_enabled,
// idempotency_key, idempotency_status, idempotency_cache_hit, ...). A replayed result carries the
// report of the execution that produced it, with the idempotency metadata of the replaying call
// merged in. Metadata keys are listed in docs/resilience.md §5 (validation_*,
// circuit_breaker_open, fallback_*, rate_limit*, idempotency_*); values are strings
// ("true"/"false", seconds as decimals).
//
// Thread-safety: a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"

namespace idem {

// rejected: the circuit breaker refused the attempt; cancelled: it ended with idem::Cancelled.
enum class AttemptStatus { succeeded, failed, timed_out, rejected, cancelled };
// The outcome of the whole call: timed_out / cancelled when the failure that ended it was a
// TimeoutError / Cancelled (the last attempt's), failed for any other failure.
enum class OperationStatus { succeeded, failed, timed_out, cancelled };

std::string_view to_string(AttemptStatus status) noexcept;
std::string_view to_string(OperationStatus status) noexcept;

struct AttemptRecord {
  int number = 0;                  // 1-based across the primary's attempts
  std::string source = "primary";  // "primary" or "fallback:<index or name>"
  AttemptStatus status = AttemptStatus::succeeded;
  WallTime started_at{};  // wall time (operation's clock) when the attempt started
  std::chrono::nanoseconds duration{0};
  std::string error_type;     // demangled exception type, empty on success
  std::string error_message;  // what(), empty on success
  bool retryable = false;     // whether the retry policy considered it retryable
  // Per-attempt details: rate_limited, rate_limit_* (every primary attempt), timeout_seconds,
  // stop_requested, attempt_stopped (a timed-out attempt), validation_* (a rejected result).
  std::map<std::string, std::string> metadata;
};

struct ExecutionReport {
  std::string operation;  // operation name
  OperationStatus status = OperationStatus::succeeded;
  WallTime started_at{};
  std::chrono::nanoseconds duration{0};
  std::vector<AttemptRecord> attempts;
  bool fallback_used = false;                  // a fallback ran (relprim's fallback_used)
  std::optional<std::string> fallback_source;  // which fallback produced the value
  std::map<std::string, std::string> metadata;

  int attempt_count() const noexcept { return static_cast<int>(attempts.size()); }
  // Attempts of the primary after its first (fallbacks are not retries).
  int retry_count() const noexcept;
  bool retried() const noexcept { return retry_count() > 0; }
  // The last attempt that failed (primary or fallback), or null when none did.
  const AttemptRecord* last_error() const noexcept;
  bool succeeded() const noexcept { return status == OperationStatus::succeeded; }

  // One JSON object with every field above (durations in nanoseconds, times as ISO-8601 UTC).
  std::string to_json() const;
  // Parses to_json() output back (used by durable stores to replay the original report).
  static ExecutionReport from_json(std::string_view json);
};

}  // namespace idem
