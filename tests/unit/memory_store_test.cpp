// InMemoryIdempotencyStore beyond the protocol (the protocol itself is checked by
// tests/conformance/memory_store_conformance_test.cpp): options, the capacity bound and its two
// policies, automatic sweeping, object identity, and heavy concurrent use.
#include "idem/memory_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <typeindex>
#include <vector>

#include "../run_together.hpp"
#include "idem/error.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::ClaimOutcome;
using idem::InMemoryIdempotencyStore;
using idem::InMemoryStoreOptions;

idem::StoredValue text(const std::string& value) {
  return idem::StoredValue{std::make_shared<const std::string>(value),
                           std::type_index(typeid(std::string)), std::nullopt};
}

class MemoryStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<InMemoryIdempotencyStore> make(InMemoryStoreOptions options = {}) {
    options.clock = clock_;
    return std::make_shared<InMemoryIdempotencyStore>(std::move(options));
  }
  std::uint64_t claim(InMemoryIdempotencyStore& store, const std::string& key,
                      idem::Millis lease = 30s) {
    const auto outcome = store.claim(key, std::nullopt, lease);
    EXPECT_EQ(outcome.status, ClaimOutcome::Status::acquired) << key;
    return outcome.token;
  }
  void complete(InMemoryIdempotencyStore& store, const std::string& key, idem::Millis ttl = 1h) {
    const std::uint64_t token = claim(store, key);
    ASSERT_TRUE(store.complete(key, token, text(key), {}, ttl));
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
};

TEST_F(MemoryStoreTest, BadOptionsAreConfigErrors) {
  EXPECT_THROW(InMemoryIdempotencyStore(InMemoryStoreOptions{.shards = 0}), idem::ConfigError);
  EXPECT_THROW(InMemoryIdempotencyStore(InMemoryStoreOptions{.capacity = 0}), idem::ConfigError);
}

TEST_F(MemoryStoreTest, DefaultsUseTheSystemClock) {
  InMemoryIdempotencyStore store;
  EXPECT_FALSE(store.needs_bytes());
  const auto before = std::chrono::system_clock::now();
  ASSERT_EQ(store.claim("k", std::nullopt, 30s).status, ClaimOutcome::Status::acquired);
  const auto after = std::chrono::system_clock::now();
  const auto lease_until = store.lookup("k")->lease_until;
  EXPECT_GE(lease_until, before + 30s);
  EXPECT_LE(lease_until, after + 30s);
}

TEST_F(MemoryStoreTest, TheDefaultStoreIsOneInMemoryStore) {
  auto store = idem::default_idempotency_store();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store, idem::default_idempotency_store());
  EXPECT_NE(dynamic_cast<InMemoryIdempotencyStore*>(store.get()), nullptr);
}

TEST_F(MemoryStoreTest, ValuesAreKeptAsTheVeryObject) {
  auto store = make();
  const std::uint64_t token = claim(*store, "k");
  const idem::StoredValue value = text("receipt");
  ASSERT_TRUE(store->complete("k", token, value, {}, 1h));
  EXPECT_EQ(store->lookup("k")->value.object, value.object) << "no copy, no serialisation";
}

TEST_F(MemoryStoreTest, TokensComeFromOneStoreWideCounter) {
  auto store = make();
  std::uint64_t last = 0;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t token = claim(*store, "key-" + std::to_string(i));
    EXPECT_GT(token, last);
    last = token;
  }
}

// ---- capacity ---------------------------------------------------------------------------------

TEST_F(MemoryStoreTest, AFullStoreRejectsNewKeysButServesKnownOnes) {
  auto store = make({.capacity = 3});
  complete(*store, "a");
  const std::uint64_t b = claim(*store, "b");
  claim(*store, "c");
  try {
    static_cast<void>(store->claim("d", std::nullopt, 30s));
    ADD_FAILURE() << "expected StoreError";
  } catch (const idem::StoreError& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("capacity 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store->entry_count(), 3u);
  EXPECT_FALSE(store->lookup("d").has_value());
  // Keys already held still answer.
  EXPECT_EQ(store->claim("a", std::nullopt, 30s).status, ClaimOutcome::Status::completed);
  EXPECT_EQ(store->claim("b", std::nullopt, 30s).status, ClaimOutcome::Status::in_progress);
  // Freeing a slot makes room.
  ASSERT_TRUE(store->release("b", b));
  claim(*store, "d");
}

TEST_F(MemoryStoreTest, AFullStoreDropsExpiredResultsFirst) {
  auto store = make({.capacity = 2});
  complete(*store, "short", 10s);
  complete(*store, "long", 1h);
  clock_->advance(10s);
  claim(*store, "new");  // "short" expired: its slot is reused
  EXPECT_EQ(store->entry_count(), 2u);
  EXPECT_TRUE(store->lookup("long").has_value());
}

TEST_F(MemoryStoreTest, AFullStoreDropsAbandonedClaimsFirst) {
  auto store = make({.capacity = 1});
  const std::uint64_t abandoned = claim(*store, "abandoned", 5s);
  clock_->advance(5s);
  claim(*store, "new");
  EXPECT_EQ(store->entry_count(), 1u);
  EXPECT_FALSE(store->complete("abandoned", abandoned, text("late"), {}, 1h))
      << "a dropped claim's token is fenced off like a taken-over one";
}

TEST_F(MemoryStoreTest, EvictOldestCompletedTradesTheOldestResultForRoom) {
  auto store =
      make({.capacity = 3, .when_full = InMemoryStoreOptions::WhenFull::evict_oldest_completed});
  complete(*store, "first");
  clock_->advance(1s);
  complete(*store, "second");
  claim(*store, "running");
  claim(*store, "fourth");  // evicts "first", the oldest completed
  EXPECT_FALSE(store->lookup("first").has_value());
  EXPECT_TRUE(store->lookup("second").has_value());
  claim(*store, "fifth");  // evicts "second"
  EXPECT_FALSE(store->lookup("second").has_value());
  EXPECT_EQ(store->entry_count(), 3u);
  // Only claims in progress are left: they are never evicted.
  EXPECT_THROW(static_cast<void>(store->claim("sixth", std::nullopt, 30s)), idem::StoreError);
  EXPECT_EQ(store->lookup("running")->state, idem::IdempotencyRecord::State::in_progress);
}

TEST_F(MemoryStoreTest, CapacityHoldsUnderConcurrentClaims) {
  constexpr int kThreads = 8;
  constexpr int kKeysPerThread = 100;
  auto store = make({.capacity = 100});
  std::atomic<int> acquired{0};
  std::atomic<int> refused{0};
  idem::test::run_together(kThreads, [&](int t) {
    for (int i = 0; i < kKeysPerThread; ++i) {
      try {
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (store->claim(key, std::nullopt, 30s).status == ClaimOutcome::Status::acquired) {
          ++acquired;
        }
      } catch (const idem::StoreError&) {
        ++refused;
      }
    }
  });
  EXPECT_EQ(acquired.load(), 100);
  EXPECT_EQ(refused.load(), kThreads * kKeysPerThread - 100);
  EXPECT_EQ(store->entry_count(), 100u);
}

// ---- sweeping ---------------------------------------------------------------------------------

TEST_F(MemoryStoreTest, ExpiredResultsAreSweptWithoutPurge) {
  // A store nobody purges must stay bounded by what is live: every shard sweeps itself once it
  // has grown to max(64, twice its size after the last sweep).
  constexpr std::size_t kShards = 16;
  auto store = make({.shards = kShards});
  for (int i = 0; i < 20'000; ++i) {
    complete(*store, "request-" + std::to_string(i), 1s);
    if (i % 100 == 99) clock_->advance(1s);  // at most 100 results are live at a time
  }
  EXPECT_LE(store->entry_count(), kShards * 64 + 100);
  EXPECT_GT(store->purge_expired(), 0u);
  EXPECT_LE(store->entry_count(), 100u);
}

TEST_F(MemoryStoreTest, ExpiredRecordsMetByLookupAreDropped) {
  auto store = make();
  complete(*store, "k", 1s);
  clock_->advance(1s);
  EXPECT_EQ(store->entry_count(), 1u);
  EXPECT_FALSE(store->lookup("k").has_value());
  EXPECT_EQ(store->entry_count(), 0u);
}

// ---- concurrency ------------------------------------------------------------------------------

TEST_F(MemoryStoreTest, ManyThreadsManyKeysOneOwnerEach) {
  constexpr int kThreads = 8;
  constexpr int kKeys = 2'000;
  auto store = make({.shards = 4});
  std::vector<std::atomic<int>> owners(kKeys);
  idem::test::run_together(kThreads, [&](int t) {
    for (int i = 0; i < kKeys; ++i) {
      const int k = (i + t * 37) % kKeys;  // threads walk the keys in different orders
      const std::string key = "key-" + std::to_string(k);
      const auto outcome = store->claim(key, std::nullopt, 30s);
      if (outcome.status == ClaimOutcome::Status::acquired) {
        ++owners[k];
        EXPECT_TRUE(store->renew(key, outcome.token, 30s));
        EXPECT_TRUE(store->complete(key, outcome.token, text(key), {}, 1h));
      } else {
        EXPECT_TRUE(outcome.status == ClaimOutcome::Status::in_progress ||
                    outcome.status == ClaimOutcome::Status::completed);
      }
      if (i % 500 == 0) store->purge_expired();
      (void)store->lookup(key);
    }
  });
  for (int k = 0; k < kKeys; ++k)
    ASSERT_EQ(owners[k].load(), 1) << "key-" << k;
  EXPECT_EQ(store->entry_count(), static_cast<std::size_t>(kKeys));
}

}  // namespace
