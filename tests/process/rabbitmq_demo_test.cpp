// `idem demo --broker amqp://...` on the test broker (IDEM_TEST_AMQP_URL): the crash-and-replay
// demo delivered through RabbitMQ — a consumer process SIGKILLed inside a handler, its
// unacknowledged messages redelivered to a fresh process — passes its exactly-once check in every
// handler mode on a SQLite recorder and with a Redis recorder; a bad or unreachable broker stops
// the demo before anything is published, without printing the password, and leaves no work dir.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "../integration/rabbitmq_test_env.hpp"
#include "../integration/redis_test_env.hpp"
#include "../temp_dir.hpp"
#include "demo_cli.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using idem::test::has;
using idem::test::run_cli;

idem::test::CliRun run_broker_demo(const std::string& mode, const std::string& store = "") {
  std::vector<std::string> arguments = {
      "demo", "--events", "400", "--mode", mode, "--broker", idem::test::amqp_url()};
  if (!store.empty()) arguments.insert(arguments.end(), {"--store", store});
  return run_cli(arguments);
}

TEST(RabbitMqDemo, EveryModeOnSqliteDeliversThroughTheBrokerOnce) {
  IDEM_REQUIRE_CLI();
  for (const char* mode : {"transactional", "exclusive", "check_then_mark"}) {
    SCOPED_TRACE(mode);
    const auto run = run_broker_demo(mode);
    idem::test::expect_demo_ok(run, "400", mode);
    EXPECT_TRUE(has(run, "its unacknowledged messages go back to the queue")) << run.output;
    EXPECT_TRUE(has(run, "(acked after each handler)")) << run.output;
  }
}

TEST(RabbitMqDemo, ARedisRecorderBehindTheBroker) {
  IDEM_REQUIRE_CLI();
  if (idem::test::redis_url().empty()) GTEST_SKIP() << "no Redis server (IDEM_TEST_REDIS_URL)";
  idem::test::RedisTestPrefix prefix("demo-amqp");
  const auto run =
      run_broker_demo("exclusive", idem::test::redis_url() + "?prefix=" + prefix.prefix());
  idem::test::expect_demo_ok(run, "400", "exclusive");
  EXPECT_EQ(prefix.key_count(), 0u) << run.output;
}

TEST(RabbitMqDemo, TwoHopsThroughTheOutboxAndTheBroker) {
  IDEM_REQUIRE_CLI();
  const auto run = idem::test::run_two_hop_demo("300", "", idem::test::amqp_url());
  idem::test::expect_two_hop_demo_ok(run, 300);
  EXPECT_TRUE(has(run, "confirmed by the broker, before it deleted")) << run.output;
  EXPECT_TRUE(has(run, "its unacknowledged messages go back to the queue")) << run.output;
}

TEST(RabbitMqDemo, ABadOrUnreachableBrokerStopsTheDemoBeforeItPublishes) {
  IDEM_REQUIRE_CLI();
  idem::test::TempDir tmp;  // the demo's TMPDIR: its work dir must be gone afterwards
  const auto down =
      run_cli({"demo", "--events", "50", "--broker", "amqp://guest:hunter22@127.0.0.1:1/"},
              {"TMPDIR=" + tmp.path().string()});
  idem::test::expect_stopped_before_start(down, 3);  // a store error
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << down.output;
  EXPECT_FALSE(has(down, "hunter22")) << down.output;
  const auto bad = run_cli({"demo", "--events", "50", "--broker", "http://guest:hunter22@x/"});
  idem::test::expect_stopped_before_start(bad, 2);
  EXPECT_FALSE(has(bad, "hunter22")) << bad.output;
}

TEST(RabbitMqDemo, ASignalWhileConsumingThroughTheBrokerLeavesNothing) {
  IDEM_REQUIRE_CLI();
  idem::test::TempDir tmp;
  const auto run = run_cli({"demo", "--events", "200", "--broker", idem::test::amqp_url()},
                           {"TMPDIR=" + tmp.path().string(), "IDEM_DEMO_RAISE_AT=consuming:TERM"});
  EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.output;
  EXPECT_TRUE(has(run, "stopped by SIGTERM in phase consuming")) << run.output;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << run.output;
}

}  // namespace
