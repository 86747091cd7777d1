// What relprim 0.9 reports, checked the same way on both operation faces
// (unit/operation_parity_test.cpp blocking, unit/async_resilient_test.cpp coroutines): event
// names in order, and the rate-limit keys of a call that met no rate limit.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idem/events.hpp"
#include "idem/report.hpp"

namespace idem::test {

// The sink's event types by name, in the order they were emitted.
inline std::vector<std::string> type_names(const idem::InMemoryEventSink& sink) {
  std::vector<std::string> out;
  for (auto type : sink.types())
    out.emplace_back(idem::to_string(type));
  return out;
}

// A call whose first attempt is rate limited and retried, and whose second is rate limited with
// a wait longer than allowed: relprim reports each rate limit before its attempt.failed.
inline const std::vector<std::string> kRateLimitedTwiceEvents = {
    "operation.started", "attempt.started", "rate_limit.detected", "attempt.failed",
    "retry.scheduled",   "attempt.started", "rate_limit.detected", "rate_limit.wait_exceeded",
    "attempt.failed",    "operation.failed"};

// Every primary attempt carries the rate-limit keys, "false" / "backoff" without a rate limit.
inline void expect_not_rate_limited(const idem::AttemptRecord& attempt) {
  EXPECT_EQ(attempt.metadata.at("rate_limited"), "false");
  EXPECT_EQ(attempt.metadata.at("rate_limit_delay_source"), "backoff");
  EXPECT_EQ(attempt.metadata.at("rate_limit_wait_exceeded"), "false");
  EXPECT_EQ(attempt.metadata.count("rate_limit_delay_seconds"), 0u);
  EXPECT_EQ(attempt.metadata.count("rate_limit_retry_after_seconds"), 0u);
}

// Every report carries the rate-limit summary, with or without a rate-limit policy.
inline void expect_no_rate_limit_in(const idem::ExecutionReport& report) {
  const auto& m = report.metadata;
  EXPECT_EQ(m.at("rate_limited"), "false");
  EXPECT_EQ(m.at("rate_limit_encountered"), "false");
  EXPECT_EQ(m.at("rate_limit_wait_seconds"), "0");
  EXPECT_EQ(m.at("rate_limit_wait_exceeded"), "false");
  EXPECT_EQ(m.count("rate_limit_retry_after_seconds"), 0u);
}

}  // namespace idem::test
