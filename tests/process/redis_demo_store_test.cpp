// `idem demo --store redis://...` on the test server (IDEM_TEST_REDIS_URL): the claim-based modes
// pass their exactly-once check twice against one server (fresh consumer names keep the runs
// apart); transactional mode is refused before anything starts; passwords stay out of output.
#include <gtest/gtest.h>

#include <string>

#include "../integration/redis_test_env.hpp"
#include "demo_cli.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::test::has;
using idem::test::run_demo;

TEST(RedisDemoStore, ClaimModesTwiceOnOneServer) {
  IDEM_REQUIRE_CLI();
  idem::test::RedisTestPrefix prefix("demo");  // its keys are deleted afterwards
  const std::string url = idem::test::redis_url() + "?prefix=" + prefix.prefix();
  for (const char* mode : {"exclusive", "check_then_mark"}) {
    for (int run = 0; run < 2; ++run) {
      const auto result = run_demo(url, mode);
      SCOPED_TRACE(mode);
      idem::test::expect_demo_ok(result, "400");
    }
  }
  EXPECT_GT(prefix.key_count(), 0u);
}

TEST(RedisDemoStore, TransactionalModeIsRefusedBeforeAnythingStarts) {
  IDEM_REQUIRE_CLI();
  const auto result = run_demo(idem::test::redis_url(), "transactional");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(has(result, "not_supported")) << result.output;
  EXPECT_TRUE(has(result, "--mode transactional")) << result.output;
  EXPECT_FALSE(has(result, "producer:")) << result.output;
}

TEST(RedisDemoStore, TwoHopsAreRefusedBeforeAnythingStarts) {
  IDEM_REQUIRE_CLI();
  const auto result = idem::test::run_two_hop_demo("50", idem::test::redis_url());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(has(result, "--hops 2")) << result.output;
  EXPECT_TRUE(has(result, "has no outbox")) << result.output;
  EXPECT_FALSE(has(result, "producer:")) << result.output;
}

TEST(RedisDemoStore, AnUnreachableServerOrABadUrlStopsTheDemo) {
  IDEM_REQUIRE_CLI();
  const auto down = run_demo("redis://:hunter2@127.0.0.1:1/0", "exclusive");
  EXPECT_EQ(down.exit_code, 3) << down.output;  // a store error (docs/cli.md)
  EXPECT_FALSE(has(down, "producer:")) << down.output;
  EXPECT_FALSE(has(down, "hunter2")) << down.output;
  const auto bad = run_demo("redis://:hunter2@127.0.0.1:6379/0?prefx=a", "exclusive");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(has(bad, "'prefx'")) << bad.output;
  EXPECT_FALSE(has(bad, "hunter2")) << bad.output;
}

}  // namespace
