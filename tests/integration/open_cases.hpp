// Shared by the open_recorder / open_store tests of the server backends (redis_open_test.cpp,
// postgres_open_test.cpp): what an opened recorder and an opened store must do, the same for
// every backend.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"

namespace idem::test {

// An opened recorder's claims: "e2" is acquired once, a second claim is refused while it is held,
// and completing it marks "e2" processed.
inline void expect_opened_recorder_claims(IdempotencyRecorder& recorder) {
  using namespace std::chrono_literals;
  const auto claim = recorder.claim("c", "e2", 1s);
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  EXPECT_NE(recorder.claim("c", "e2", 1s).status, Claim::Status::acquired);
  EXPECT_TRUE(recorder.complete("c", "e2", claim.token));
  EXPECT_TRUE(recorder.is_processed("c", "e2"));
}

// An opened store claims "order-1" (a second claim finds it in progress) and completes it with
// "42"; `reopen()`, another store on the same data, then replays that record.
inline void expect_opened_store_claims_and_replays(
    IdempotencyStore& store, const std::function<std::shared_ptr<IdempotencyStore>()>& reopen) {
  using namespace std::chrono_literals;
  const auto first = store.claim("order-1", std::string("fp"), 10s);
  ASSERT_EQ(first.status, ClaimOutcome::Status::acquired);
  EXPECT_EQ(store.claim("order-1", std::string("fp"), 10s).status,
            ClaimOutcome::Status::in_progress);
  StoredValue value;
  value.bytes = "42";
  ASSERT_TRUE(store.complete("order-1", first.token, value, ExecutionReport{}, 1h));
  const auto again = reopen();
  const auto replay = again->claim("order-1", std::string("fp"), 10s);
  ASSERT_EQ(replay.status, ClaimOutcome::Status::completed);
  ASSERT_TRUE(replay.record.has_value());
  EXPECT_EQ(replay.record->value.bytes, std::optional<std::string>("42"));
}

}  // namespace idem::test
