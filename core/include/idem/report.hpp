// ExecutionReport: what happened during one resilient operation.
//
// Every call through idem::resilient / idem::operation produces a report: overall status, when
// it started and how long it took, every attempt (primary and fallbacks), whether a fallback
// produced the result, and a string metadata map (idempotency_enabled, idempotency_key,
// idempotency_status, idempotency_cache_hit, ...). A replayed result carries the report of the
// execution that produced it, with the idempotency metadata of the replaying call merged in.
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

enum class AttemptStatus { succeeded, failed, timed_out, rejected };
enum class OperationStatus { succeeded, failed };

std::string_view to_string(AttemptStatus status) noexcept;
std::string_view to_string(OperationStatus status) noexcept;

struct AttemptRecord {
  int number = 0;                  // 1-based across the primary's attempts
  std::string source = "primary";  // "primary" or "fallback:<index or name>"
  AttemptStatus status = AttemptStatus::succeeded;
  std::chrono::nanoseconds duration{0};
  std::string error_type;     // demangled exception type, empty on success
  std::string error_message;  // what(), empty on success
  bool retryable = false;     // whether the retry policy considered it retryable
};

struct ExecutionReport {
  std::string operation;  // operation name
  OperationStatus status = OperationStatus::succeeded;
  WallTime started_at{};
  std::chrono::nanoseconds duration{0};
  std::vector<AttemptRecord> attempts;
  bool fallback_used = false;
  std::optional<std::string> fallback_source;  // which fallback produced the value
  std::map<std::string, std::string> metadata;

  // One JSON object with every field above (durations in nanoseconds, times as ISO-8601 UTC).
  std::string to_json() const;
  // Parses to_json() output back (used by durable stores to replay the original report).
  static ExecutionReport from_json(std::string_view json);
};

}  // namespace idem
