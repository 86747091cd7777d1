// A Redis Cluster primary killed with SIGKILL under a recorder that keeps marking (the cluster of
// scripts/servers.sh: three primaries with a replica each, cluster-node-timeout 2 s, so the
// replica is promoted a few seconds after the kill). The recorder must:
//  * end every call, within its deadlines, with success or a retryable / in-doubt RedisError;
//  * reach the promoted replica by itself (MOVED, or the layout read again), with no new object;
//  * keep every mark written with min_replicas=1 before the kill (its replica confirmed it).
// Afterwards the killed node is started again (it rejoins as the replica of the promoted one) and
// made primary again with CLUSTER FAILOVER, a coordinated switch that loses nothing, so the
// cluster is as servers.sh left it (primaries first in IDEM_TEST_REDIS_CLUSTER_PORTS) for the
// tests that follow.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../server_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"

IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL",
                             "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0");

namespace {

using namespace std::chrono_literals;
using idem::redis::CommandKind;
using idem::redis::ConnectionPool;
using idem::redis::RedisError;
using idem::redis::RedisOptions;
using Clock = std::chrono::steady_clock;

std::vector<int> cluster_ports() {
  std::istringstream text(idem::test::env("IDEM_TEST_REDIS_CLUSTER_PORTS"));
  std::vector<int> out;
  int port = 0;
  while (text >> port)
    out.push_back(port);
  return out;
}

// One command to one node; nullopt when it does not answer.
std::optional<idem::redis::RedisReply> ask(int port, std::initializer_list<std::string_view> args) {
  try {
    RedisOptions options;
    options.port = port;
    options.connect_timeout = 500ms;
    options.command_timeout = 2s;
    ConnectionPool pool(options);
    auto connection = pool.lease();
    return connection->command(args, CommandKind::read);
  } catch (const RedisError&) {
    return std::nullopt;
  }
}

bool info_has(int port, const char* section, const std::string& text) {
  const auto info = ask(port, {"INFO", section});
  return info && info->str.find(text) != std::string::npos;
}

bool eventually(const std::function<bool()>& condition, std::chrono::seconds limit = 30s) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return condition();
}

// As scripts/servers.sh leaves it: every node sees state ok, the first three ports are primaries
// with their replica online, the other three replicas with their link up.
bool cluster_as_started() {
  const auto ports = cluster_ports();
  for (std::size_t i = 0; i < ports.size(); ++i) {
    const auto state = ask(ports[i], {"CLUSTER", "INFO"});
    if (!state || state->str.find("cluster_state:ok") == std::string::npos) return false;
    const auto nodes = ask(ports[i], {"CLUSTER", "NODES"});
    if (!nodes || nodes->str.find("fail") != std::string::npos) return false;
    if (i < 3 ? !info_has(ports[i], "replication", "connected_slaves:1")
              : !info_has(ports[i], "replication", "master_link_status:up")) {
      return false;
    }
  }
  return true;
}

std::vector<std::string> ids(const std::string& tag, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tag + "-" + std::to_string(i));
  return out;
}

class RedisClusterFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL").empty()) GTEST_SKIP();
    ASSERT_TRUE(eventually(cluster_as_started)) << "the cluster is not whole before the test";
  }
};

TEST_F(RedisClusterFailover, AKilledPrimaryIsReplacedAndCallsEndWithinTheirDeadlines) {
  auto options = RedisOptions::from_url(idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL"));
  options.key_prefix = "idemtest:" + std::to_string(::getpid()) + ":cluster-kill:";
  options.connect_timeout = 500ms;
  options.command_timeout = 2s;
  // Written with min_replicas=1: each primary's replica holds them before the kill.
  auto durable = options;
  durable.min_replicas = 1;
  const auto before = ids("before", 300);
  idem::redis::RedisIdempotencyRecorder(durable).mark_processed_many("billing", before);

  idem::redis::RedisIdempotencyRecorder recorder(options);
  const int victim = cluster_ports().at(0);
  const std::string dir =
      idem::test::env("IDEM_TEST_REDIS_CLUSTER_DIR") + "/" + std::to_string(victim);
  pid_t pid = 0;
  std::ifstream(dir + "/redis.pid") >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);

  // Single marks round the keyspace (a third of them on the killed primary's slots) until a
  // whole batch over every slot succeeds after the promotion.
  const auto bound = options.connect_timeout + options.command_timeout + 5s;
  const auto limit = Clock::now() + 60s;
  std::vector<std::string> acknowledged;
  int failures = 0;
  bool recovered = false;
  for (int i = 0; !recovered && Clock::now() < limit; ++i) {
    const std::string id = "during-" + std::to_string(i);
    const auto start = Clock::now();
    try {
      recorder.mark_processed("billing", id);
      acknowledged.push_back(id);
      if (i % 20 == 0) {
        const auto batch = ids("probe-" + std::to_string(i), 30);
        recorder.mark_processed_many("billing", batch);
        recovered = true;
      }
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
      ++failures;
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_LT(Clock::now() - start, bound) << "call " << i << " did not end in time";
  }
  ASSERT_TRUE(recovered) << "no batch over every slot succeeded within 60 s of the kill";
  EXPECT_GT(failures, 0) << "no call noticed the primary was gone";
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true))
      << "a mark its replica had confirmed was lost";
  // Acknowledged after the kill: by a live primary, or by the promoted replica.
  EXPECT_EQ(recorder.is_processed_many("billing", acknowledged),
            std::vector<bool>(acknowledged.size(), true));

  // Put the cluster back: the node rejoins as a replica, then takes its primary role back.
  ASSERT_EQ(std::system(("redis-server " + dir + "/redis.conf >/dev/null").c_str()), 0);
  ASSERT_TRUE(eventually([&] { return info_has(victim, "replication", "master_link_status:up"); }))
      << "the restarted node did not sync as a replica";
  const auto failover = ask(victim, {"CLUSTER", "FAILOVER"});
  ASSERT_TRUE(failover.has_value());
  ASSERT_FALSE(failover->is_error()) << failover->str;
  EXPECT_TRUE(eventually(cluster_as_started, 60s)) << "the cluster did not come back as started";
  EXPECT_EQ(recorder.is_processed_many("billing", before), std::vector<bool>(before.size(), true));
}

}  // namespace
