// RedisIdempotencyStore beyond the conformance suite: the string it writes, Redis expiries (only
// for space), damaged records of every kind (a clear store_corrupt_record error naming what is
// wrong, never a guess), the hashes of an older idem (read, replayed, replaced only when dead),
// claims that start with a GET or with SET NX GET (the store picks by its last claim), records
// of the layout whose tokens came from a shared counter (read, replayed, taken over when dead),
// NOSCRIPT after SCRIPT FLUSH, pages of SCAN, and idem::resilient() on top — executed then
// replayed with the original report, across two stores (two "processes"), and a stored result
// that no longer decodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/idempotency.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_names;

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

  // A raw command of any length (HSET of many fields).
  RedisReply command(const std::vector<std::string>& args) {
    const std::vector<std::string_view> views(args.begin(), args.end());
    const auto store = make();  // outlives the connection it lends
    auto connection = store->pool()->lease();
    return connection->command(std::span<const std::string_view>(views));
  }

  // A completed record in the string layout, as idem writes it.
  static std::string completed_text(const std::string& value, long long expires_at,
                                    const std::string& report = idem::ExecutionReport{}.to_json()) {
    return "1c 1 " + std::to_string(kClockStartMs) + " " + std::to_string(expires_at) + " " +
           std::to_string(value.size()) + " " + std::to_string(report.size()) + " " + value +
           report + std::to_string(kClockStartMs) + " -";
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

  // Runs `claim` twice: after a claim of a new key (so the claim starts with the acquire
  // script) and after a replay (so it starts with a GET). A claim that throws leaves the start
  // as it was. Leaves primed_ keys in the store.
  template <class Claim>
  void for_each_claim_start(RedisIdempotencyStore& store, Claim&& claim) {
    const std::string key = "primed-" + std::to_string(primed_++);
    const auto fresh = store.claim(key, std::nullopt, 10s);
    ASSERT_EQ(fresh.status, idem::ClaimOutcome::Status::acquired);
    claim();
    ASSERT_TRUE(store.complete(key, fresh.token, bytes("p"), {}, 1h));
    ASSERT_EQ(store.claim(key, std::nullopt, 10s).status, idem::ClaimOutcome::Status::completed);
    claim();
  }

  idem::StoredValue bytes(std::string text) {
    idem::StoredValue value;
    value.bytes = std::move(text);
    return value;
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
  idem::test::RedisTestPrefix keys_{"store"};
  std::size_t primed_ = 0;  // keys for_each_claim_start() made
};

TEST_F(RedisStore, OneStringPerKeyInTheDocumentedLayout) {
  auto store = make();
  EXPECT_TRUE(store->needs_bytes());
  const std::string key = store->record_key("order-1");
  EXPECT_EQ(key, keys_.prefix() + "s:{order-1}");

  const auto claim = store->claim("order-1", "fp", 10s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  const std::string token = std::to_string(claim.token);
  const std::string lease_until = std::to_string(kClockStartMs + 10'000);
  EXPECT_EQ(keys_.command({"GET", key}).str, "1i " + token + " " + lease_until + " =fp");
  EXPECT_EQ(keys_.command({"PEXPIRETIME", key}).integer, kClockStartMs + 10'000 + 3'600'000)
      << "lease_until + the default slack of 1 h";
  EXPECT_EQ(keys_.command({"EXISTS", keys_.prefix() + "tokens"}).integer, 0)
      << "tokens come from no shared counter";

  clock_->advance(2s);
  idem::ExecutionReport report;
  report.operation = "pay";
  ASSERT_TRUE(store->complete("order-1", claim.token, bytes("receipt"), report, 60s));
  const std::string text = keys_.command({"GET", key}).str;
  const std::string head = "1c " + token + " " + std::to_string(kClockStartMs + 2'000) + " " +
                           std::to_string(kClockStartMs + 62'000) + " 7 ";
  EXPECT_EQ(text.substr(0, head.size()), head) << text;
  const std::string tail = lease_until + " =fp";  // the claim's, moved over
  ASSERT_GT(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << text;
  // The report's size, then the value and the report themselves.
  const std::size_t report_at = head.size() + text.substr(head.size()).find(' ') + 1;
  const std::size_t report_size = std::stoul(text.substr(head.size()));
  EXPECT_EQ(text.substr(report_at, 7), "receipt");
  EXPECT_EQ(idem::ExecutionReport::from_json(text.substr(report_at + 7, report_size)).operation,
            "pay");
  EXPECT_EQ(report_at + 7 + report_size + tail.size(), text.size());
  EXPECT_EQ(keys_.command({"PEXPIRETIME", key}).integer, kClockStartMs + 62'000 + 3'600'000);

  // No fingerprint: "-"; a renewal rewrites the lease and keeps it.
  const auto other = store->claim("order-2", std::nullopt, 10s);
  const std::string other_key = store->record_key("order-2");
  EXPECT_EQ(
      keys_.command({"GET", other_key}).str,
      "1i " + std::to_string(other.token) + " " + std::to_string(kClockStartMs + 12'000) + " -");
  ASSERT_TRUE(store->renew("order-2", other.token, 30s));
  EXPECT_EQ(
      keys_.command({"GET", other_key}).str,
      "1i " + std::to_string(other.token) + " " + std::to_string(kClockStartMs + 32'000) + " -");
  EXPECT_EQ(keys_.command({"PEXPIRETIME", other_key}).integer, kClockStartMs + 32'000 + 3'600'000);
  EXPECT_FALSE(store->renew("order-1", claim.token, 30s)) << "completed: fenced";
}

TEST_F(RedisStore, AClaimStartsAsTheStoresLastClaimEnded) {
  // After a claim that took its key, the next claim goes straight to SET NX GET (a new key in
  // one round trip, a record found there comes back in its reply); after one that found a live
  // record, it reads first (a replay is one GET). Both give the same outcome.
  auto store = make();
  int fresh_keys = 0;

  const auto first = store->claim("a", "fp", 10s);
  ASSERT_EQ(first.status, idem::ClaimOutcome::Status::acquired);
  ASSERT_TRUE(store->complete("a", first.token, bytes("A"), {}, 1h));
  const std::string completed = keys_.command({"GET", store->record_key("a")}).str;

  // Started with SET NX GET: the key is taken, so the reply is the record, left unchanged.
  const auto replay = store->claim("a", "fp", 10s);
  ASSERT_EQ(replay.status, idem::ClaimOutcome::Status::completed);
  EXPECT_EQ(*replay.record->value.bytes, "A");
  EXPECT_EQ(replay.record->token, first.token);
  EXPECT_EQ(keys_.command({"GET", store->record_key("a")}).str, completed);

  // Started with a GET.
  EXPECT_EQ(store->claim("a", "other", 10s).status, idem::ClaimOutcome::Status::mismatch);
  EXPECT_EQ(store->claim("a", "fp", 10s).status, idem::ClaimOutcome::Status::completed);

  // A new key after a replay: the GET finds nothing, then SET NX GET takes it.
  const auto second = store->claim("b", std::nullopt, 10s);
  ASSERT_EQ(second.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(second.token, first.token) << "one process's tokens only grow";
  // A live claim found by SET NX GET: in progress, with its owner's token.
  const auto held = store->claim("b", std::nullopt, 10s);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_EQ(held.record->token, second.token);

  // An expired result and an abandoned claim are replaced, whichever way the claim starts.
  for (const bool read_first : {false, true}) {
    SCOPED_TRACE(read_first ? "after a replay: GET first" : "after a new key: script first");
    const std::string tag = read_first ? "-get" : "-script";
    const auto done = store->claim("c" + tag, std::nullopt, 10s);
    ASSERT_TRUE(store->complete("c" + tag, done.token, bytes("C"), {}, 1s));
    const auto dead = store->claim("d" + tag, std::nullopt, 1s);
    ASSERT_EQ(dead.status, idem::ClaimOutcome::Status::acquired);
    clock_->advance(2s);
    const auto prime = [&] {
      if (read_first) {
        ASSERT_EQ(store->claim("a", "fp", 10s).status, idem::ClaimOutcome::Status::completed);
      } else {
        ASSERT_EQ(
            store->claim("fresh" + tag + std::to_string(fresh_keys++), std::nullopt, 10s).status,
            idem::ClaimOutcome::Status::acquired);
      }
    };
    prime();
    const auto renewed = store->claim("c" + tag, std::nullopt, 10s);
    ASSERT_EQ(renewed.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_FALSE(renewed.took_over);
    EXPECT_GT(renewed.token, dead.token);
    prime();
    const auto taken = store->claim("d" + tag, std::nullopt, 10s);
    ASSERT_EQ(taken.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_TRUE(taken.took_over);
    EXPECT_GT(taken.token, dead.token);
    EXPECT_FALSE(store->complete("d" + tag, dead.token, bytes("late"), {}, 1h)) << "fenced off";
    EXPECT_TRUE(store->complete("d" + tag, taken.token, bytes("D"), {}, 1h));
  }
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
  // Strings in the layout idem writes, damaged.
  const std::string good_report = idem::ExecutionReport{}.to_json();
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"x", "not an idem record"},
      {"1x 1 99999999999999 -", "not an idem record"},
      {"1i x 99999999999999 -", "token is not an integer"},
      {"1i -3 99999999999999 -", "token is not an integer"},
      {"1i 1 99999999999999", "lease_until is not an integer"},
      {"1i 1 99999999999999 ?", "fingerprint"},
      {"1c 1 1 tomorrow 1 2 v{}1 -", "expires_at is not an integer"},
      {"1c 1 1 99999999999999 50 2 v{}1 -", "shorter than its value and report"},
      {"1c 1 1 99999999999999 1 9 v{not json1 -", "report"},
      {completed_text("v", 99999999999999, good_report).substr(0, 45), "shorter"},
  };
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::string key = "text-" + std::to_string(i);
    SCOPED_TRACE(texts[i].first);
    keys_.command({"SET", store->record_key(key), texts[i].first});
    expect_corrupt([&] { (void)store->lookup(key); }, texts[i].second);
    for_each_claim_start(*store, [&] {
      expect_corrupt([&] { (void)store->claim(key, std::nullopt, 10s); }, texts[i].second);
    });
    expect_corrupt([&] { (void)store->lookup(key); }, store->record_key(key));
  }
  // Hashes as an older idem wrote them, damaged.
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
    for_each_claim_start(*store, [&] {
      expect_corrupt([&] { (void)store->claim(damage.key, std::nullopt, 10s); }, damage.complaint);
    });
    expect_corrupt([&] { (void)store->lookup(damage.key); }, record);  // names the redis key
  }
  // A key of another type under the record's name.
  keys_.command({"RPUSH", store->record_key("a-list"), "x"});
  expect_corrupt([&] { (void)store->lookup("a-list"); }, "WRONGTYPE");
  for_each_claim_start(*store, [&] {
    expect_corrupt([&] { (void)store->claim("a-list", std::nullopt, 10s); }, "WRONGTYPE");
  });
  // Nothing else is disturbed; purge and count step over what they cannot read.
  EXPECT_EQ(store->claim("healthy", std::nullopt, 10s).status,
            idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(store->purge_expired(), 0u);
  EXPECT_EQ(store->entry_count(), texts.size() + damages.size() + 2 + primed_);
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
  keys_.command({"SET", store->record_key("forever"), completed_text("v", 99999999999999)});
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
  // A takeover is the claim's one script.
  const auto dead = store->claim("dead", std::nullopt, 1s);
  clock_->advance(1s);
  keys_.command({"SCRIPT", "FLUSH"});
  const auto taken = store->claim("dead", std::nullopt, 10s);
  ASSERT_EQ(taken.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_FALSE(store->release("dead", dead.token));
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
  keys_.command({"SET", store->record_key(idem::scoped_idempotency_key("receipts", "receipt:abc")),
                 completed_text("forty-two", kClockStartMs + 3'600'000)});
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

TEST_F(RedisStore, RecordsOfAnOlderIdemAreReadAndReplacedOnlyWhenDead) {
  // An older idem kept each record as a hash. Its live records still count: results replay,
  // claims hold the key; dead ones are replaced like any other, with larger tokens.
  auto store = make();
  const std::string report = idem::ExecutionReport{}.to_json();
  const std::string start = std::to_string(kClockStartMs);
  const auto hash = [&](const std::string& key, std::vector<std::string> fields) {
    fields.insert(fields.begin(), {"HSET", store->record_key(key)});
    ASSERT_FALSE(command(fields).is_error());
  };
  const auto completed = [&](const std::string& key, long long expires_at) {
    hash(key, {"state", "completed", "token", "7", "fingerprint", "fp", "lease_until", start,
               "completed_at", start, "expires_at", std::to_string(expires_at), "value", "old",
               "report", report});
  };
  const auto in_progress = [&](const std::string& key, const std::string& token,
                               long long lease_until) {
    hash(key, {"state", "in_progress", "token", token, "lease_until", std::to_string(lease_until)});
  };
  completed("done", kClockStartMs + 60'000);
  completed("expired", kClockStartMs);
  completed("gone", kClockStartMs - 1);
  in_progress("running", "8", kClockStartMs + 10'000);
  in_progress("abandoned", "9", kClockStartMs);

  const auto done = store->lookup("done");
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->token, 7u);
  EXPECT_EQ(*done->value.bytes, "old");
  for_each_claim_start(*store, [&] {
    const auto replay = store->claim("done", "fp", 10s);
    ASSERT_EQ(replay.status, idem::ClaimOutcome::Status::completed);
    EXPECT_EQ(*replay.record->value.bytes, "old");
    EXPECT_EQ(store->claim("done", "other", 10s).status, idem::ClaimOutcome::Status::mismatch);
  });
  for_each_claim_start(*store, [&] {
    const auto running = store->claim("running", std::nullopt, 10s);
    ASSERT_EQ(running.status, idem::ClaimOutcome::Status::in_progress);
    EXPECT_EQ(running.record->token, 8u);
  });
  EXPECT_FALSE(store->complete("running", 8, bytes("v"), {}, 1h)) << "not this idem's claim";
  EXPECT_FALSE(store->renew("running", 8, 10s));
  EXPECT_FALSE(store->release("running", 8));
  EXPECT_FALSE(store->lookup("expired").has_value());

  const idem::StoreCounts counts = store->counts();
  EXPECT_EQ(counts.completed, 1u + primed_);
  EXPECT_EQ(counts.expired, 2u);
  EXPECT_EQ(counts.in_progress, 1u);
  EXPECT_EQ(counts.abandoned, 1u);

  // The last claim found a live record, so this one reads first and meets the hash with HGETALL;
  // the next one starts with SET NX GET, which meets the hash (WRONGTYPE, nothing written).
  const auto taken = store->claim("abandoned", std::nullopt, 10s);
  ASSERT_EQ(taken.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_GT(taken.token, 9u);
  const auto fresh = store->claim("expired", std::nullopt, 10s);
  ASSERT_EQ(fresh.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_FALSE(fresh.took_over);
  EXPECT_GT(fresh.token, taken.token);
  ASSERT_TRUE(store->complete("expired", fresh.token, bytes("new"), {}, 1h));
  EXPECT_EQ(*store->lookup("expired")->value.bytes, "new");
  EXPECT_EQ(store->purge_expired(), 1u) << "the expired hash 'gone'";

  // A claim of this idem that an older one took over (as a hash) is fenced, not an error.
  const auto mine = store->claim("swapped", std::nullopt, 10s);
  ASSERT_EQ(mine.status, idem::ClaimOutcome::Status::acquired);
  keys_.command({"DEL", store->record_key("swapped")});
  in_progress("swapped", "999", kClockStartMs + 60'000);
  EXPECT_FALSE(store->renew("swapped", mine.token, 10s));
  EXPECT_FALSE(store->complete("swapped", mine.token, bytes("v"), {}, 1h));
  EXPECT_FALSE(store->release("swapped", mine.token));
  EXPECT_EQ(store->claim("swapped", std::nullopt, 10s).status,
            idem::ClaimOutcome::Status::in_progress);
}

TEST_F(RedisStore, RecordsWithCounterTokensAreReadReplayedAndTakenOverWhenDead) {
  // The same string layout, written by an idem that drew its tokens from the counter P tokens
  // (small numbers, which a counter may repeat after a failover): live records still count,
  // dead ones are taken over with a larger token, and the counter is left alone.
  auto store = make();
  const std::string counter = keys_.prefix() + "tokens";
  keys_.command({"SET", counter, "42"});
  const std::string expiry = std::to_string(kClockStartMs + 3'600'000);
  const auto raw_set = [&](const std::string& key, const std::string& text) {
    ASSERT_EQ(keys_.command({"SET", store->record_key(key), text, "PXAT", expiry}).str, "OK");
  };
  raw_set("done", "1c 41 " + std::to_string(kClockStartMs) + " " +
                      std::to_string(kClockStartMs + 60'000) + " 3 " +
                      std::to_string(idem::ExecutionReport{}.to_json().size()) + " old" +
                      idem::ExecutionReport{}.to_json() + std::to_string(kClockStartMs) + " =fp");
  raw_set("expired", completed_text("gone", kClockStartMs));
  raw_set("running", "1i 42 " + std::to_string(kClockStartMs + 10'000) + " =fp");

  for_each_claim_start(*store, [&] {
    const auto replay = store->claim("done", "fp", 10s);
    ASSERT_EQ(replay.status, idem::ClaimOutcome::Status::completed);
    EXPECT_EQ(replay.record->token, 41u);
    EXPECT_EQ(*replay.record->value.bytes, "old");
    EXPECT_EQ(store->claim("done", "other", 10s).status, idem::ClaimOutcome::Status::mismatch);
    const auto running = store->claim("running", "fp", 10s);
    ASSERT_EQ(running.status, idem::ClaimOutcome::Status::in_progress);
    EXPECT_EQ(running.record->token, 42u);
    EXPECT_EQ(running.record->lease_until,
              idem::WallTime(std::chrono::milliseconds(kClockStartMs + 10'000)));
  });
  EXPECT_EQ(keys_.command({"GET", store->record_key("running")}).str,
            "1i 42 " + std::to_string(kClockStartMs + 10'000) + " =fp")
      << "a live claim is never changed";

  const auto fresh = store->claim("expired", std::nullopt, 10s);
  ASSERT_EQ(fresh.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_FALSE(fresh.took_over);
  EXPECT_GT(fresh.token, 42u);

  clock_->advance(10s);  // the counter-token claim's lease has ended
  const auto taken = store->claim("running", "fp", 10s);
  ASSERT_EQ(taken.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_GT(taken.token, 42u);
  EXPECT_FALSE(store->renew("running", 42, 10s)) << "the old holder is fenced off";
  EXPECT_FALSE(store->complete("running", 42, bytes("late"), {}, 1h));
  EXPECT_FALSE(store->release("running", 42));
  ASSERT_TRUE(store->complete("running", taken.token, bytes("new"), {}, 1h));
  EXPECT_EQ(*store->lookup("running")->value.bytes, "new");
  EXPECT_EQ(keys_.command({"GET", counter}).str, "42") << "the counter is not used";
}

TEST_F(RedisStore, TokensAreUniqueAndGrowAcrossThreads) {
  // No counter: every claim draws its own token. Tokens of one process never repeat and only
  // grow, whichever thread draws them.
  auto store = make();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50;
  std::vector<std::vector<std::uint64_t>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const auto claim =
            store->claim("t" + std::to_string(t) + "-" + std::to_string(i), std::nullopt, 10s);
        if (claim.status == idem::ClaimOutcome::Status::acquired) drawn[t].push_back(claim.token);
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  std::vector<std::uint64_t> all;
  for (const auto& tokens : drawn) {
    ASSERT_EQ(tokens.size(), static_cast<std::size_t>(kPerThread));
    EXPECT_TRUE(std::is_sorted(tokens.begin(), tokens.end()));
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a token repeated";
}

}  // namespace
