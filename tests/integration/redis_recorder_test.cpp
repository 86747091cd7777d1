// RedisIdempotencyRecorder beyond the conformance suite: the key layout and what is stored,
// marker TTLs and claim expiries, pipelined batch marks, purge over many keys and pages (and only
// within its prefix, glob characters included), NOSCRIPT after SCRIPT FLUSH (also mid-purge),
// takeover tokens (above the dead claim's, counter tokens of an older idem included), damaged
// claims, two recorders (two pools: two "processes") on one prefix, and IdempotentHandler
// on top.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/manual_clock.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_names;

class RedisRecorder : public ::testing::Test {
 protected:
  std::shared_ptr<RedisIdempotencyRecorder> make(idem::redis::RedisOptions options) {
    return std::make_shared<RedisIdempotencyRecorder>(std::move(options));
  }
  std::shared_ptr<RedisIdempotencyRecorder> make() { return make(keys_.options(clock_)); }

  long long integer(std::initializer_list<std::string_view> args) {
    const RedisReply reply = keys_.command(args);
    EXPECT_EQ(reply.type, RedisReply::Type::integer) << reply.str;
    return reply.integer;
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
  idem::test::RedisTestPrefix keys_{"rec"};
};

TEST_F(RedisRecorder, KeysAreReadableAndEscapedOneToOne) {
  auto recorder = make();
  const std::string& p = keys_.prefix();
  EXPECT_EQ(recorder->marker_key("billing", "e1"), p + "m:{billing:e1}");
  EXPECT_EQ(recorder->claim_key("billing", "e1"), p + "c:{billing:e1}");
  // ':' and '\' in the consumer are escaped, so the split is unambiguous.
  EXPECT_EQ(recorder->marker_key("a:b", "c"), p + "m:{a\\:b:c}");
  EXPECT_EQ(recorder->marker_key("a", "b:c"), p + "m:{a:b:c}");
  EXPECT_EQ(recorder->marker_key("a\\", "b"), p + "m:{a\\\\:b}");
  EXPECT_NE(recorder->marker_key("a\\", ":b"), recorder->marker_key("a\\:", "b"));
  // Braces in ids are allowed (they shorten the hash tag, the same for both keys of a record).
  EXPECT_EQ(recorder->claim_key("c}x", "id"), p + "c:{c}x:id}");
}

TEST_F(RedisRecorder, MarkersHoldTheClocksTimeAndNoExpiryByDefault) {
  auto recorder = make();
  recorder->mark_processed("billing", "e1");
  const std::string key = recorder->marker_key("billing", "e1");
  EXPECT_EQ(keys_.command({"GET", key}).str, std::to_string(kClockStartMs));
  EXPECT_EQ(integer({"PTTL", key}), -1) << "no marker_ttl: the marker lives until purge()";
  clock_->advance(5s);
  recorder->mark_processed("billing", "e1");
  EXPECT_EQ(keys_.command({"GET", key}).str, std::to_string(kClockStartMs))
      << "the first mark stays";
}

TEST_F(RedisRecorder, MarkerTtlIsSetOnEveryMarker) {
  auto options = keys_.options(clock_);
  options.marker_ttl = 90s;
  auto recorder = make(options);
  recorder->mark_processed("billing", "marked");
  const auto claim = recorder->claim("billing", "claimed", 30s);
  ASSERT_TRUE(recorder->complete("billing", "claimed", claim.token));
  const std::vector<std::string> ids = {"b1", "b2"};
  recorder->mark_processed_batch("billing", ids);
  for (const char* id : {"marked", "claimed", "b1", "b2"}) {
    const long long ttl = integer({"PTTL", recorder->marker_key("billing", id)});
    EXPECT_GT(ttl, 0) << id;
    EXPECT_LE(ttl, 90'000) << id;
  }
}

TEST_F(RedisRecorder, ClaimsAreHashesExpiringAfterTheirLeasePlusSlack) {
  auto options = keys_.options(clock_);
  options.expiry_slack = 10min;
  auto recorder = make(options);
  const auto claim = recorder->claim("billing", "e1", 30s);
  const std::string key = recorder->claim_key("billing", "e1");
  EXPECT_EQ(keys_.command({"HGET", key, "token"}).str, std::to_string(claim.token));
  EXPECT_EQ(keys_.command({"HGET", key, "lease_until"}).str,
            std::to_string(kClockStartMs + 30'000));
  EXPECT_EQ(integer({"PEXPIRETIME", key}), kClockStartMs + 30'000 + 600'000);
  clock_->advance(20s);
  ASSERT_TRUE(recorder->renew("billing", "e1", claim.token, 30s));
  EXPECT_EQ(integer({"PEXPIRETIME", key}), kClockStartMs + 50'000 + 600'000) << "renew moves it";
  // Tokens are drawn by the client: no shared counter key.
  EXPECT_EQ(integer({"EXISTS", keys_.prefix() + "tokens"}), 0) << "tokens come from no counter";
}

TEST_F(RedisRecorder, ATakeoverTokenExceedsTheDeadClaimsWhateverTheDrawnOneWas) {
  auto recorder = make();
  // A dead claim whose token is above any this client draws (a process whose clock ran ahead),
  // with a carry through every digit but the first; and one of the counter an older idem kept.
  const std::string ahead = recorder->claim_key("billing", "ahead");
  const std::string counted = recorder->claim_key("billing", "counted");
  const std::string dead_until = std::to_string(kClockStartMs - 1);
  keys_.command({"HSET", ahead, "token", "8999999999999999999", "lease_until", dead_until});
  keys_.command({"HSET", counted, "token", "7", "lease_until", dead_until});
  const auto over_ahead = recorder->claim("billing", "ahead", 30s);
  ASSERT_EQ(over_ahead.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(over_ahead.took_over);
  EXPECT_EQ(over_ahead.token, 9000000000000000000ULL) << "the dead claim's token plus one";
  EXPECT_EQ(keys_.command({"HGET", ahead, "token"}).str, "9000000000000000000");
  const auto over_counted = recorder->claim("billing", "counted", 30s);
  ASSERT_EQ(over_counted.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(over_counted.took_over);
  EXPECT_GT(over_counted.token, 7u);
  EXPECT_EQ(keys_.command({"HGET", counted, "token"}).str, std::to_string(over_counted.token));
  // Each is fenced by its own token.
  EXPECT_FALSE(recorder->complete("billing", "ahead", 8999999999999999999ULL));
  EXPECT_TRUE(recorder->complete("billing", "ahead", over_ahead.token));
  EXPECT_TRUE(recorder->complete("billing", "counted", over_counted.token));
  // A live claim with a counter token is held, whatever its token's size.
  const std::string live = recorder->claim_key("billing", "live");
  keys_.command(
      {"HSET", live, "token", "3", "lease_until", std::to_string(kClockStartMs + 60'000)});
  EXPECT_EQ(recorder->claim("billing", "live", 30s).status, idem::Claim::Status::in_progress);
}

TEST_F(RedisRecorder, HugeLeasesTtlsAndPurgeAgesSaturate) {
  auto options = keys_.options(clock_);
  options.marker_ttl = idem::Millis::max();
  options.expiry_slack = idem::Millis::max();
  auto recorder = make(options);
  const auto claim = recorder->claim("billing", "e1", idem::Millis::max());
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_EQ(claim.lease_until, idem::WallTime::max());
  EXPECT_TRUE(recorder->renew("billing", "e1", claim.token, idem::Millis::max()));
  EXPECT_TRUE(recorder->complete("billing", "e1", claim.token));
  recorder->mark_processed("billing", "e2");
  EXPECT_GT(integer({"PTTL", recorder->marker_key("billing", "e2")}), 0);
  EXPECT_EQ(recorder->purge(std::chrono::system_clock::duration::max()), 0u);
  EXPECT_TRUE(recorder->is_processed("billing", "e1"));
}

TEST_F(RedisRecorder, BatchMarksArePipelinedAndValidatedFirst) {
  auto recorder = make();
  std::vector<std::string> ids;
  for (int i = 0; i < 1300; ++i)  // more than one pipelined chunk (512)
    ids.push_back(idem::new_event_id());
  EXPECT_EQ(recorder->mark_processed_batch("billing", ids), ids.size());
  EXPECT_EQ(recorder->mark_processed_batch("billing", ids), 0u) << "marking again adds nothing";
  for (std::size_t i = 0; i < ids.size(); i += 97)
    EXPECT_TRUE(recorder->is_processed("billing", ids[i]));

  std::vector<std::string> with_bad = {idem::new_event_id(), "", idem::new_event_id()};
  EXPECT_THROW(recorder->mark_processed_batch("billing", with_bad), idem::InvalidKey);
  EXPECT_FALSE(recorder->is_processed("billing", with_bad[0]))
      << "nothing of a bad batch is marked";
  EXPECT_THROW(recorder->mark_processed_batch("", std::vector<std::string>{"x"}), idem::InvalidKey);
  EXPECT_EQ(recorder->mark_processed_batch("billing", std::vector<std::string>{}), 0u);
}

TEST_F(RedisRecorder, PurgeWalksManyPagesAndCountsEachMarkerOnce) {
  auto options = keys_.options(clock_);
  options.scan_count = 50;  // many SCAN pages
  auto recorder = make(options);
  std::vector<std::string> old_ids;
  for (int i = 0; i < 1000; ++i)
    old_ids.push_back("old-" + std::to_string(i));
  recorder->mark_processed_batch("billing", old_ids);
  clock_->advance(2h);
  std::vector<std::string> new_ids;
  for (int i = 0; i < 300; ++i)
    new_ids.push_back("new-" + std::to_string(i));
  recorder->mark_processed_batch("billing", new_ids);
  EXPECT_EQ(recorder->purge(1h), old_ids.size());
  EXPECT_FALSE(recorder->is_processed("billing", old_ids.front()));
  EXPECT_TRUE(recorder->is_processed("billing", new_ids.front()));
  EXPECT_EQ(keys_.key_count(), new_ids.size());
  EXPECT_EQ(recorder->purge(1h), 0u);
  EXPECT_THROW(recorder->purge(-1s), idem::InvalidArgument);
}

TEST_F(RedisRecorder, PurgeDropsDeadClaimsButDoesNotCountThem) {
  auto recorder = make();
  (void)recorder->claim("billing", "dead", 1s);
  (void)recorder->claim("billing", "live", 10h);
  clock_->advance(3h);
  EXPECT_EQ(recorder->purge(1h), 0u) << "claims are not markers";
  EXPECT_EQ(integer({"EXISTS", recorder->claim_key("billing", "dead")}), 0)
      << "a claim whose lease ended before the cutoff is gone";
  EXPECT_EQ(integer({"EXISTS", recorder->claim_key("billing", "live")}), 1);
}

TEST_F(RedisRecorder, PurgeStaysInsideItsPrefixEvenWithGlobCharacters) {
  // Two prefixes that a glob without escaping would confuse: "…[ab]*?\…" matches "…a…".
  auto options = keys_.options(clock_);
  options.key_prefix = keys_.prefix() + "[ab]*?\\:";
  auto globby = make(options);
  options.key_prefix = keys_.prefix() + "a:";
  auto plain = make(options);
  globby->mark_processed("c", "1");
  plain->mark_processed("c", "1");
  plain->mark_processed("c", "2");
  clock_->advance(2h);
  EXPECT_EQ(globby->purge(1h), 1u);
  EXPECT_TRUE(plain->is_processed("c", "1")) << "purge reached into another prefix";
  EXPECT_EQ(plain->purge(1h), 2u);
}

TEST_F(RedisRecorder, ForeignValuesUnderTheMarkerPrefixAreKept) {
  auto recorder = make();
  const std::string foreign = recorder->marker_key("billing", "foreign");
  keys_.command({"SET", foreign, "not a time"});
  keys_.command({"HSET", recorder->marker_key("billing", "hash"), "a", "b"});
  recorder->mark_processed("shipping", "e1");
  clock_->advance(24h * 365);
  // What purge will keep because it cannot read a time is counted, per consumer (idem purge
  // reports it).
  const idem::PurgeableMarkers markers = recorder->purgeable_markers(1h);
  EXPECT_EQ(markers.old, 1u);
  EXPECT_EQ(markers.unreadable, 2u);
  ASSERT_EQ(markers.consumers.size(), 2u);
  EXPECT_EQ(markers.consumers[0].consumer, "billing");
  EXPECT_EQ(markers.consumers[0].old, 0u);
  EXPECT_EQ(markers.consumers[0].unreadable, 2u);
  EXPECT_EQ(markers.consumers[1].consumer, "shipping");
  EXPECT_EQ(markers.consumers[1].old, 1u);
  EXPECT_EQ(markers.consumers[1].unreadable, 0u);
  EXPECT_EQ(recorder->count_purgeable(1h), 1u);
  EXPECT_EQ(recorder->purge(1h), 1u);
  EXPECT_EQ(integer({"EXISTS", foreign}), 1) << "purge deletes only what it can read as a time";
  EXPECT_EQ(recorder->purgeable_markers(1h).unreadable, 2u) << "and keeps counting the rest";
}

TEST_F(RedisRecorder, ScriptsAreReloadedAfterScriptFlush) {
  auto recorder = make();
  const auto first = recorder->claim("billing", "e1", 30s);
  ASSERT_EQ(first.status, idem::Claim::Status::acquired);
  keys_.command({"SCRIPT", "FLUSH"});  // what a server restart does to the script cache
  EXPECT_TRUE(recorder->renew("billing", "e1", first.token, 30s));
  keys_.command({"SCRIPT", "FLUSH"});
  EXPECT_TRUE(recorder->complete("billing", "e1", first.token));
  keys_.command({"SCRIPT", "FLUSH"});
  EXPECT_EQ(recorder->claim("billing", "e1", 30s).status, idem::Claim::Status::processed);
  keys_.command({"SCRIPT", "FLUSH"});
  clock_->advance(2h);
  EXPECT_EQ(recorder->purge(1h), 1u);
}

// A flush can land between purge's SCRIPT LOAD and its pipelined EVALSHAs (another client's
// SCRIPT FLUSH, a failover): the calls answered NOSCRIPT are sent again with the source.
TEST_F(RedisRecorder, PurgeSurvivesScriptFlushesWhileItRuns) {
  auto options = keys_.options(clock_);
  options.scan_count = 20;  // many pipelines, so flushes land between and inside them
  auto recorder = make(options);
  constexpr int kRounds = 5;
  constexpr int kMarkers = 400;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::string> ids;
    for (int i = 0; i < kMarkers; ++i)
      ids.push_back("r" + std::to_string(round) + "-" + std::to_string(i));
    recorder->mark_processed_batch("billing", ids);
    clock_->advance(2h);
    std::atomic<bool> done{false};
    std::thread flusher([&] {
      for (int i = 0; i < 10000 && !done.load(); ++i)
        keys_.command({"SCRIPT", "FLUSH"});
    });
    std::size_t purged = 0;
    EXPECT_NO_THROW(purged = recorder->purge(1h));
    done = true;
    flusher.join();
    EXPECT_EQ(purged, static_cast<std::size_t>(kMarkers)) << "round " << round;
    EXPECT_EQ(keys_.key_count(), 0u);
  }
}

TEST_F(RedisRecorder, DamagedClaimsAreReportedNotGuessed) {
  auto recorder = make();
  keys_.command(
      {"HSET", recorder->claim_key("billing", "garbled"), "token", "x", "lease_until", "soon"});
  // A token past 19 digits (beyond any token) is as damaged as a word.
  keys_.command({"HSET", recorder->claim_key("billing", "long"), "token", "12345678901234567890",
                 "lease_until", "1"});
  try {
    (void)recorder->claim("billing", "long", 30s);
    FAIL() << "a token beyond 19 digits was accepted";
  } catch (const idem::StoreError& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_corrupt_record);
  }
  try {
    (void)recorder->claim("billing", "garbled", 30s);
    FAIL() << "a garbled claim was accepted";
  } catch (const idem::StoreError& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_corrupt_record);
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("garbled"), std::string::npos) << e.what();
  }
  keys_.command({"SET", recorder->claim_key("billing", "string"), "not a hash"});
  try {
    (void)recorder->claim("billing", "string", 30s);
    FAIL() << "a claim key of the wrong type was accepted";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_corrupt_record);
    EXPECT_EQ(e.failure(), idem::redis::RedisFailure::reply);
    EXPECT_NE(std::string(e.what()).find("WRONGTYPE"), std::string::npos) << e.what();
  }
  // Other events are unaffected.
  EXPECT_EQ(recorder->claim("billing", "fine", 30s).status, idem::Claim::Status::acquired);
}

TEST_F(RedisRecorder, TwoPoolsOnOnePrefixSeeEachOther) {
  auto first = make();
  auto second = make();  // its own pool, as another process would have
  first->mark_processed("billing", "e1");
  EXPECT_TRUE(second->is_processed("billing", "e1"));
  const auto claim = second->claim("billing", "e2", 30s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  const auto other = first->claim("billing", "e2", 30s);
  EXPECT_EQ(other.status, idem::Claim::Status::in_progress);
  EXPECT_EQ(other.lease_until, claim.lease_until);
  EXPECT_FALSE(first->complete("billing", "e2", claim.token + 1));
  EXPECT_TRUE(first->complete("billing", "e2", claim.token)) << "tokens, not pools, own claims";
  EXPECT_TRUE(second->is_processed("billing", "e2"));
}

TEST_F(RedisRecorder, IdempotentHandlerRunsEachEventOnce) {
  auto recorder = make();
  int runs = 0;
  auto handler = idem::make_idempotent_handler<std::string>(
      "billing", recorder,
      [&](const std::string& payload, idem::BusProxy&, const idem::Event&) {
        if (payload == "fail") throw std::runtime_error("handler failed");
        ++runs;
      },
      idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
  idem::CollectingBusProxy bus("billing");
  auto event = idem::Event::make("invoice.created", "ok");
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
  EXPECT_EQ(runs, 1);
  auto failing = idem::Event::make("invoice.created", "fail");
  EXPECT_THROW((*handler)(failing, bus), std::runtime_error);
  EXPECT_FALSE(recorder->is_processed("billing", failing.id));
  EXPECT_EQ(integer({"EXISTS", recorder->claim_key("billing", failing.id)}), 0)
      << "a failed handler releases its claim";
}

}  // namespace
