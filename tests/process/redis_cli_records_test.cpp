// `idem list` and `idem release` run as processes (IDEM_CLI) on the test Redis server
// (IDEM_TEST_REDIS_URL), under a key prefix of the test's own: listing pages through SCAN with a
// small COUNT (so that pages end inside SCAN batches and continue after their last key), every
// record of the operation comes back and no other, and a forced release fences the holder off.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../integration/redis_test_env.hpp"
#include "demo_cli.hpp"
#include "idem/open.hpp"
#include "idem/operation_idempotency.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::test::CliRun;
using idem::test::has;
using idem::test::run_cli;
using std::chrono::hours;

std::string stored(const std::string& key) {
  return idem::scoped_idempotency_key("create_payment", key);
}

TEST(RedisCliRecords, ListPagesThroughEveryRecordOfAnOperationOnce) {
  IDEM_REQUIRE_CLI();
  idem::test::RedisTestPrefix prefix("cli-list");  // its keys are deleted afterwards
  // COUNT 3: a SCAN batch is small and often holds more keys than a page has room for.
  const std::string url = idem::test::redis_url() + "?prefix=" + prefix.prefix() + "&scan_count=3";
  const auto store = idem::open_store(url);
  constexpr int kRecords = 25;
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = stored("request-" + std::to_string(i));
    const auto claim = store->claim(key, std::nullopt, hours(1));
    ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
    if (i % 2 == 0) {
      ASSERT_TRUE(store->complete(key, claim.token, {{}, {}, "r"}, {}, hours(1)));
    }
  }
  // Neither of these is a record of create_payment.
  ASSERT_EQ(store->claim("request-1", std::nullopt, hours(1)).status,
            idem::ClaimOutcome::Status::acquired);
  ASSERT_EQ(
      store->claim(idem::scoped_idempotency_key("refund", "request-1"), std::nullopt, hours(1))
          .status,
      idem::ClaimOutcome::Status::acquired);

  std::map<std::string, std::string> seen;  // user's key -> state
  std::vector<std::string> args = {"list",    url, "--operation", "create_payment",
                                   "--limit", "4", "--json"};
  int pages = 0;
  for (; pages < 100; ++pages) {
    const CliRun page = run_cli(args);
    ASSERT_EQ(page.exit_code, 0) << page.output;
    const auto out = nlohmann::json::parse(page.output);
    EXPECT_LE(out["records"].size(), 4u);
    for (const auto& record : out["records"]) {
      EXPECT_EQ(record["scope"], "create_payment") << record.dump();
      seen[record["key"].get<std::string>()] = record["state"].get<std::string>();
    }
    if (out["next"].is_null()) break;
    args.resize(7);
    args.insert(args.end(), {"--cursor", out["next"].get<std::string>()});
  }
  EXPECT_GE(pages, kRecords / 4) << "--limit bounds each page";
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kRecords));
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = "request-" + std::to_string(i);
    ASSERT_EQ(seen.count(key), 1u) << key;
    EXPECT_EQ(seen[key], i % 2 == 0 ? "completed" : "in_progress") << key;
  }
}

TEST(RedisCliRecords, ForcedReleaseFencesTheHolderOff) {
  IDEM_REQUIRE_CLI();
  idem::test::RedisTestPrefix prefix("cli-release");
  const std::string url = idem::test::redis_url() + "?prefix=" + prefix.prefix();
  const auto store = idem::open_store(url);
  const std::string key = stored("running");
  const auto claim = store->claim(key, std::nullopt, hours(1));
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);

  const CliRun refused = run_cli({"release", url, "running", "--operation", "create_payment"});
  EXPECT_EQ(refused.exit_code, 4) << refused.output;
  EXPECT_TRUE(has(refused, "is live")) << refused.output;
  EXPECT_EQ(store->lookup(key)->token, claim.token) << "a refusal changes nothing";

  const CliRun forced =
      run_cli({"release", url, "running", "--operation", "create_payment", "--force"});
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(has(forced, "fenced off")) << forced.output;
  EXPECT_FALSE(store->lookup(key).has_value());
  EXPECT_FALSE(store->complete(key, claim.token, {{}, {}, "late"}, {}, hours(1)));
  const auto next = store->claim(key, std::nullopt, hours(1));
  ASSERT_EQ(next.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(next.token, claim.token);
  EXPECT_FALSE(store->release(key, claim.token)) << "the old holder stays fenced off";
  EXPECT_TRUE(store->complete(key, next.token, {{}, {}, "fresh"}, {}, hours(1)));
}

}  // namespace
