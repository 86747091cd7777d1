// RedisIdempotencyStore beyond the conformance suite: the hash it writes, Redis expiries (only
// for space), damaged records of every kind (a clear store_corrupt_record error naming the field,
// never a guess), NOSCRIPT after SCRIPT FLUSH, pages of SCAN, and idem::resilient() on top —
// executed then replayed with the original report, across two stores (two "processes"), and a
// stored result that no longer decodes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/idempotency.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::redis::RedisIdempotencyStore;
using idem::redis::RedisReply;
using namespace std::chrono_literals;

constexpr long long kStartMs = 1893456000000;  // ManualClock's default start, 2030-01-01

struct Receipt {
  std::string id;
  int cents = 0;
  NLOHMANN_DEFINE_TYPE_INTRUSIVE(Receipt, id, cents)
};

class RedisStore : public ::testing::Test {
 protected:
  std::shared_ptr<RedisIdempotencyStore> make(std::shared_ptr<idem::Clock> clock = nullptr) {
    return std::make_shared<RedisIdempotencyStore>(
        keys_.options(clock ? std::move(clock) : clock_));
  }

  std::string field(const std::string& key, const std::string& name) {
    return keys_.command({"HGET", key, name}).str;
  }

  // Expects `call` to throw StoreError(store_corrupt_record) whose message names `needle`.
  template <class Call>
  void expect_corrupt(Call&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "a damaged record was accepted (expected a complaint about " << needle
                    << ")";
    } catch (const idem::StoreError& e) {
      EXPECT_EQ(e.code(), idem::ErrorCode::store_corrupt_record) << e.what();
      EXPECT_FALSE(e.retryable());
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }

  idem::StoredValue bytes(std::string text) {
    idem::StoredValue value;
    value.bytes = std::move(text);
    return value;
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
  idem::test::RedisTestPrefix keys_{"store"};
};

TEST_F(RedisStore, OneHashPerKeyWithEveryDocumentedField) {
  auto store = make();
  EXPECT_TRUE(store->needs_bytes());
  const std::string key = store->record_key("order-1");
  EXPECT_EQ(key, keys_.prefix() + "s:{order-1}");

  const auto claim = store->claim("order-1", "fp", 10s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(field(key, "state"), "in_progress");
  EXPECT_EQ(field(key, "token"), std::to_string(claim.token));
  EXPECT_EQ(field(key, "fingerprint"), "fp");
  EXPECT_EQ(field(key, "lease_until"), std::to_string(kStartMs + 10'000));
  EXPECT_EQ(keys_.command({"PEXPIRETIME", key}).integer, kStartMs + 10'000 + 3'600'000)
      << "lease_until + the default slack of 1 h";
  EXPECT_EQ(keys_.command({"GET", keys_.prefix() + "tokens"}).str, std::to_string(claim.token));

  clock_->advance(2s);
  idem::ExecutionReport report;
  report.operation = "pay";
  ASSERT_TRUE(store->complete("order-1", claim.token, bytes("receipt"), report, 60s));
  EXPECT_EQ(field(key, "state"), "completed");
  EXPECT_EQ(field(key, "completed_at"), std::to_string(kStartMs + 2'000));
  EXPECT_EQ(field(key, "expires_at"), std::to_string(kStartMs + 62'000));
  EXPECT_EQ(field(key, "value"), "receipt");
  EXPECT_EQ(idem::ExecutionReport::from_json(field(key, "report")).operation, "pay");
  EXPECT_EQ(keys_.command({"PEXPIRETIME", key}).integer, kStartMs + 62'000 + 3'600'000);

  // No fingerprint: no field at all (so it never mismatches).
  (void)store->claim("order-2", std::nullopt, 10s);
  EXPECT_TRUE(keys_.command({"HGET", store->record_key("order-2"), "fingerprint"}).is_nil());
}

TEST_F(RedisStore, ARecordStillPresentAfterItsExpiryIsReportedAbsent) {
  // Redis expiries are set far beyond idem's own decision (the clock is years ahead of the
  // server), so this is idem deciding on read, not Redis having deleted it.
  auto store = make();
  const auto claim = store->claim("k", std::nullopt, 10s);
  ASSERT_TRUE(store->complete("k", claim.token, bytes("v"), {}, 1s));
  clock_->advance(1s);
  EXPECT_EQ(keys_.command({"EXISTS", store->record_key("k")}).integer, 1);
  EXPECT_FALSE(store->lookup("k").has_value());
  EXPECT_EQ(store->entry_count(), 1u) << "held until purged";
  EXPECT_EQ(store->purge_expired(), 1u);
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST_F(RedisStore, DamagedRecordsGiveAClearError) {
  auto store = make();
  struct Damage {
    std::string key;
    std::vector<std::string> fields;  // field, value, ...
    std::string complaint;
  };
  const std::string report = idem::ExecutionReport{}.to_json();
  const std::vector<Damage> damages = {
      {"unknown-state", {"state", "paused", "token", "1"}, "unknown state 'paused'"},
      {"no-state", {"token", "1", "lease_until", "1"}, "field 'state' is missing"},
      {"no-token", {"state", "in_progress", "lease_until", "99999999999999"}, "'token'"},
      {"bad-token",
       {"state", "in_progress", "token", "-3", "lease_until", "99999999999999"},
       "'token' is not an integer"},
      {"no-lease", {"state", "in_progress", "token", "1"}, "'lease_until'"},
      {"bad-expiry",
       {"state", "completed", "token", "1", "completed_at", "1", "expires_at", "tomorrow", "value",
        "v", "report", report},
       "'expires_at'"},
      {"no-value",
       {"state", "completed", "token", "1", "completed_at", "1", "expires_at", "99999999999999",
        "report", report},
       "'value' is missing"},
      {"bad-report",
       {"state", "completed", "token", "1", "completed_at", "1", "expires_at", "99999999999999",
        "value", "v", "report", "{not json"},
       "'report'"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.key);
    std::vector<std::string_view> hset = {"HSET", store->record_key(damage.key)};
    const std::string record = store->record_key(damage.key);
    hset[1] = record;
    hset.insert(hset.end(), damage.fields.begin(), damage.fields.end());
    auto connection = store->pool()->lease();
    (void)connection->command(std::span<const std::string_view>(hset));
    expect_corrupt([&] { (void)store->lookup(damage.key); }, damage.complaint);
    expect_corrupt([&] { (void)store->claim(damage.key, std::nullopt, 10s); }, damage.complaint);
    expect_corrupt([&] { (void)store->lookup(damage.key); }, record);  // names the redis key
  }
  // A key of another type under the record's name.
  keys_.command({"SET", store->record_key("a-string"), "x"});
  expect_corrupt([&] { (void)store->lookup("a-string"); }, "WRONGTYPE");
  expect_corrupt([&] { (void)store->claim("a-string", std::nullopt, 10s); }, "WRONGTYPE");
  // Nothing else is disturbed; purge and count step over what they cannot read.
  EXPECT_EQ(store->claim("healthy", std::nullopt, 10s).status,
            idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(store->purge_expired(), 0u);
  EXPECT_EQ(store->entry_count(), damages.size() + 2);
}

TEST_F(RedisStore, LeasesAndTtlsBeyondTheClocksRangeMeanForever) {
  // WallTime ends in 2262; longer spans are stored as "until then", never overflowing.
  auto store = make();
  const auto claim = store->claim("forever", std::nullopt, idem::Millis::max());
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(store->lookup("forever")->lease_until, idem::WallTime::max());
  EXPECT_TRUE(store->renew("forever", claim.token, idem::Millis::max()));
  ASSERT_TRUE(store->complete("forever", claim.token, bytes("v"), {}, idem::Millis::max()));
  const auto record = store->lookup("forever");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->expires_at, idem::WallTime::max());
  clock_->advance(24h * 365 * 200);
  EXPECT_EQ(store->claim("forever", std::nullopt, 10s).status,
            idem::ClaimOutcome::Status::completed);
  // A stored time written by someone else beyond the range is read the same way.
  keys_.command({"HSET", store->record_key("forever"), "expires_at", "99999999999999"});
  EXPECT_EQ(store->lookup("forever")->expires_at, idem::WallTime::max());
}

TEST_F(RedisStore, ScriptsAreReloadedAfterScriptFlush) {
  auto store = make();
  for (int round = 0; round < 2; ++round) {
    const std::string key = "k" + std::to_string(round);
    keys_.command({"SCRIPT", "FLUSH"});
    const auto claim = store->claim(key, std::nullopt, 10s);
    ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
    keys_.command({"SCRIPT", "FLUSH"});
    EXPECT_TRUE(store->renew(key, claim.token, 10s));
    keys_.command({"SCRIPT", "FLUSH"});
    if (round == 0) {
      EXPECT_TRUE(store->complete(key, claim.token, bytes("v"), {}, 1s));
    } else {
      EXPECT_TRUE(store->release(key, claim.token));
    }
  }
  clock_->advance(1s);
  keys_.command({"SCRIPT", "FLUSH"});
  EXPECT_EQ(store->purge_expired(), 1u);
}

TEST_F(RedisStore, PurgeAndCountWalkManyPages) {
  auto options = keys_.options(clock_);
  options.scan_count = 25;
  auto store = std::make_shared<RedisIdempotencyStore>(options);
  for (int i = 0; i < 400; ++i) {
    const std::string key = "key-" + std::to_string(i);
    const auto claim = store->claim(key, std::nullopt, 10s);
    if (i % 4 != 0) {
      ASSERT_TRUE(store->complete(key, claim.token, bytes("v"), {}, i % 2 == 0 ? 1s : 1h));
    }
  }
  EXPECT_EQ(store->entry_count(), 400u);
  clock_->advance(1s);
  EXPECT_EQ(store->purge_expired(), 100u);  // i % 4 == 2: completed with ttl 1 s
  EXPECT_EQ(store->entry_count(), 300u);
}

// A flush between purge_expired's SCRIPT LOAD and its pipelined EVALSHAs (another client, a
// failover) must not fail the purge: calls answered NOSCRIPT are sent again with the source.
TEST_F(RedisStore, PurgeSurvivesScriptFlushesWhileItRuns) {
  auto options = keys_.options(clock_);
  options.scan_count = 20;
  auto store = std::make_shared<RedisIdempotencyStore>(options);
  constexpr int kKeys = 300;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kKeys; ++i) {
      const std::string key = "r" + std::to_string(round) + "-" + std::to_string(i);
      const auto claim = store->claim(key, std::nullopt, 10s);
      ASSERT_TRUE(store->complete(key, claim.token, bytes("v"), {}, 1s));
    }
    clock_->advance(2s);
    std::atomic<bool> done{false};
    std::thread flusher([&] {
      for (int i = 0; i < 10000 && !done.load(); ++i)
        keys_.command({"SCRIPT", "FLUSH"});
    });
    std::size_t purged = 0;
    EXPECT_NO_THROW(purged = store->purge_expired());
    done = true;
    flusher.join();
    EXPECT_EQ(purged, static_cast<std::size_t>(kKeys)) << "round " << round;
    EXPECT_EQ(store->entry_count(), 0u);
  }
}

template <class Signature>
idem::ResilientOptions<Signature> idempotent(std::shared_ptr<idem::IdempotencyStore> store,
                                             std::shared_ptr<idem::Clock> clock) {
  idem::ResilientOptions<Signature> options;
  options.name = "receipts";
  options.retries = 0;
  options.idempotency_key = [](const std::string& id) { return "receipt:" + id; };
  options.idempotency_store = std::move(store);
  options.idempotency_ttl = 1h;
  options.clock = std::move(clock);
  return options;
}

TEST_F(RedisStore, ResilientExecutesOnceAndReplaysAcrossStores) {
  std::atomic<int> runs{0};
  const auto fn = [&](const std::string& id) {
    ++runs;
    return Receipt{"r-" + id, 2499};
  };
  // Two stores with their own pools and coordinators: two processes as far as idem can tell.
  using Signature = Receipt(const std::string&);
  auto first = idem::resilient<Signature>(fn, idempotent<Signature>(make(), clock_));
  auto second = idem::resilient<Signature>(fn, idempotent<Signature>(make(), clock_));

  const auto executed = first("123");
  EXPECT_EQ(executed.value.id, "r-123");
  EXPECT_EQ(executed.report.metadata.at("idempotency_status"), "executed");
  const auto replayed = second("123");
  EXPECT_EQ(replayed.value.id, "r-123");
  EXPECT_EQ(replayed.value.cents, 2499);
  EXPECT_EQ(replayed.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(replayed.report.started_at, executed.report.started_at) << "the original report";
  EXPECT_EQ(runs.load(), 1);

  clock_->advance(1h);  // the result expires: the next call executes again
  EXPECT_EQ(second("123").report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(runs.load(), 2);
}

TEST_F(RedisStore, AStoredResultThatNoLongerDecodesIsADecodeError) {
  auto store = make();
  int runs = 0;
  using Signature = int(const std::string&);
  auto count = idem::resilient<Signature>(
      [&](const std::string&) {
        ++runs;
        return 42;
      },
      idempotent<Signature>(store, clock_));
  EXPECT_EQ(count("abc").value, 42);
  keys_.command({"HSET", store->record_key(idem::scoped_idempotency_key("receipts", "receipt:abc")),
                 "value", "forty-two"});
  EXPECT_THROW(count("abc"), idem::DecodeError);
  EXPECT_EQ(runs, 1) << "an undecodable replay must not run the operation again";
}

TEST_F(RedisStore, TakeoverAcrossStoresFencesTheOldOwner) {
  auto crashed = make();
  auto successor = make();
  const auto old_claim = crashed->claim("job", std::nullopt, 5s);
  ASSERT_EQ(old_claim.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(successor->claim("job", std::nullopt, 5s).status,
            idem::ClaimOutcome::Status::in_progress);
  clock_->advance(5s);
  const auto taken = successor->claim("job", std::nullopt, 5s);
  ASSERT_EQ(taken.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_FALSE(crashed->complete("job", old_claim.token, bytes("late"), {}, 1h))
      << "a late complete with the old token is refused";
  EXPECT_TRUE(successor->complete("job", taken.token, bytes("fresh"), {}, 1h));
  EXPECT_EQ(*crashed->lookup("job")->value.bytes, "fresh");
}

}  // namespace
