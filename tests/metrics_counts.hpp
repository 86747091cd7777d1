// What the metrics tests (metrics_test.cpp, async_metrics_test.cpp) check of a snapshot: how many
// deliveries of a consumer, or calls of an operation, ended with each outcome.
//
//   idem::test::expect_counts(billing, {{DeliveryOutcome::processed, 1}, {DeliveryOutcome::failed,
//   2}});
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "idem/metrics.hpp"
#include "idem/observer.hpp"

namespace idem::test {

inline void expect_counts(
    const idem::ConsumerMetrics& metrics,
    std::initializer_list<std::pair<idem::DeliveryOutcome, std::uint64_t>> counts) {
  for (const auto& [outcome, count] : counts) {
    EXPECT_EQ(metrics.count(outcome), count) << idem::to_string(outcome);
  }
}

inline void expect_counts(
    const idem::OperationMetrics& metrics,
    std::initializer_list<std::pair<idem::CallOutcome, std::uint64_t>> counts) {
  for (const auto& [outcome, count] : counts) {
    EXPECT_EQ(metrics.count(outcome), count) << idem::to_string(outcome);
  }
}

}  // namespace idem::test
