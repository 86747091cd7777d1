// `idem demo --store redis://...` on the test server (IDEM_TEST_REDIS_URL): the claim-based modes
// pass their checks twice against one server (a key prefix of the run's own keeps the runs apart,
// and is emptied afterwards); a prefix that holds data is refused unless
// --allow-nonempty-store; transactional mode is refused before anything starts; passwords stay
// out of output.
#include <gtest/gtest.h>

#include <string>

#include "../integration/redis_test_env.hpp"
#include "demo_cli.hpp"
#include "idem/open.hpp"

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
      idem::test::expect_demo_ok(result, "400", mode);
      EXPECT_TRUE(has(result, "recorder:  redis://")) << result.output;
      EXPECT_EQ(prefix.key_count(), 0u) << "the demo left keys under " << prefix.prefix();
    }
  }
}

TEST(RedisDemoStore, APrefixWithDataIsRefusedUnlessAllowedAndLeftAsItWas) {
  IDEM_REQUIRE_CLI();
  idem::test::RedisTestPrefix prefix("demo-data");
  const std::string url = idem::test::redis_url() + "?prefix=" + prefix.prefix();
  idem::open_recorder(url)->mark_processed("payments", "evt-precious");
  const std::size_t before = prefix.key_count();
  const auto refused = run_demo(url, "exclusive", "50");
  idem::test::expect_stopped_before_start(refused, 2, {"already holds data", "'payments'"});
  EXPECT_EQ(prefix.key_count(), before);
  const auto allowed = idem::test::run_cli({"demo", "--events", "100", "--mode", "check_then_mark",
                                            "--store", url, "--allow-nonempty-store"});
  idem::test::expect_demo_ok(allowed, "100", "check_then_mark");
  EXPECT_EQ(prefix.key_count(), before) << allowed.output;
  EXPECT_TRUE(idem::open_recorder(url)->is_processed("payments", "evt-precious"));
}

TEST(RedisDemoStore, TransactionalModeIsRefusedBeforeAnythingStarts) {
  IDEM_REQUIRE_CLI();
  const auto result = run_demo(idem::test::redis_url(), "transactional");
  idem::test::expect_stopped_before_start(result, 2, {"not_supported", "--mode transactional"});
}

TEST(RedisDemoStore, TwoHopsAreRefusedBeforeAnythingStarts) {
  IDEM_REQUIRE_CLI();
  const auto result = idem::test::run_two_hop_demo("50", idem::test::redis_url());
  idem::test::expect_stopped_before_start(result, 2, {"--hops 2", "has no outbox"});
}

TEST(RedisDemoStore, AnUnreachableServerOrABadUrlStopsTheDemo) {
  IDEM_REQUIRE_CLI();
  const auto down = run_demo("redis://:hunter2@127.0.0.1:1/0", "exclusive");
  idem::test::expect_stopped_before_start(down, 3);  // a store error
  EXPECT_FALSE(has(down, "hunter2")) << down.output;
  const auto bad = run_demo("redis://:hunter2@127.0.0.1:6379/0?prefx=a", "exclusive");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(has(bad, "'prefx'")) << bad.output;
  EXPECT_FALSE(has(bad, "hunter2")) << bad.output;
}

}  // namespace
