// Shared by the fault tests in which a store's server refuses writes for a while
// (postgres_limits_fault_test.cpp: a locked table; process/redis_oom_fault_test.cpp: Redis out of
// memory): what the store must do during the fault and after it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "idem/idempotency_store.hpp"

namespace idem::test {

// What a test supplies: how the fault starts and ends, and the check of each refused call.
struct StoreWriteFault {
  std::function<void()> begin;
  std::function<void()> end;
  std::function<void(const std::function<void()>&)> expect_refused;
  bool reads_during_fault = false;  // whether the record is looked up before the fault ends
};

// "held" is claimed before the fault. During it, a new claim and the completion of "held" are
// refused and leave nothing behind: "fresh" is absent, "held" still in progress. After it, "held"
// completes with its value and "fresh" can be claimed.
inline void expect_store_writes_refused_then_resumed(IdempotencyStore& store,
                                                     const StoreWriteFault& fault) {
  using namespace std::chrono_literals;
  const auto held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  StoredValue value;
  value.bytes = "42";
  fault.begin();
  fault.expect_refused([&] { (void)store.claim("fresh", std::nullopt, 30s); });
  fault.expect_refused([&] { (void)store.complete("held", held.token, value, {}, 1h); });
  if (!fault.reads_during_fault) fault.end();
  EXPECT_FALSE(store.lookup("fresh").has_value());
  const auto during = store.lookup("held");
  ASSERT_TRUE(during.has_value());
  EXPECT_EQ(during->state, IdempotencyRecord::State::in_progress);
  if (fault.reads_during_fault) fault.end();
  EXPECT_TRUE(store.complete("held", held.token, value, {}, 1h));
  const auto done = store.lookup("held");
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->value.bytes, std::optional<std::string>("42"));
  EXPECT_EQ(store.claim("fresh", std::nullopt, 30s).status, ClaimOutcome::Status::acquired);
}

}  // namespace idem::test
