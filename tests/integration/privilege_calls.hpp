// Every call of the recorder's and of the store's API, on keys of its own, each expected to work:
// what a run-time identity holding only the documented rights (a PostgreSQL role with the
// documented grants, a Redis ACL user with the documented rule) must be able to do. The
// privilege tests run them as that identity; the calls whose results depend on the data are
// made for the rights they need (a refusal would throw).
//
// Thread-safety: for one test thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"

namespace idem::test {

// Consumer "c", events e1 to e4.
inline void every_recorder_call_works(IdempotencyRecorder& recorder) {
  using namespace std::chrono_literals;
  EXPECT_FALSE(recorder.is_processed("c", "e1"));
  recorder.mark_processed("c", "e1");
  EXPECT_TRUE(recorder.is_processed("c", "e1"));
  const std::vector<std::string> ids = {"e1", "e2"};
  EXPECT_EQ(recorder.is_processed_many("c", ids), (std::vector<bool>{true, false}));
  recorder.mark_processed_many("c", ids);
  const Claim claim = recorder.claim("c", "e3", 5s);
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  EXPECT_TRUE(recorder.renew("c", "e3", claim.token, 5s));
  EXPECT_TRUE(recorder.complete("c", "e3", claim.token));
  const Claim other = recorder.claim("c", "e4", 5s);
  EXPECT_TRUE(recorder.release("c", "e4", other.token));
  (void)recorder.purge(24h);
  (void)recorder.count_purgeable(24h);
  (void)recorder.consumer_counts();
  (void)recorder.inspect("c", "e3");
}

// Keys k1 and k2.
inline void every_store_call_works(IdempotencyStore& store) {
  using namespace std::chrono_literals;
  const ClaimOutcome owned = store.claim("k1", std::string_view("fp"), 5s);
  ASSERT_EQ(owned.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(store.renew("k1", owned.token, 5s));
  StoredValue value;
  value.bytes = "result";
  EXPECT_TRUE(store.complete("k1", owned.token, value, ExecutionReport{}, 1h));
  const auto record = store.lookup("k1");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->value.bytes, "result");
  EXPECT_EQ(store.claim("k1", std::string_view("fp"), 5s).status, ClaimOutcome::Status::completed);
  const ClaimOutcome dropped = store.claim("k2", std::nullopt, 5s);
  EXPECT_TRUE(store.release("k2", dropped.token));
  (void)store.purge_expired();
  (void)store.counts();
  (void)store.entry_count();
  EXPECT_TRUE(store.wait("k1", std::chrono::steady_clock::now() + 1s, {}).has_value());
}

}  // namespace idem::test
