// Helpers of the Redis Cluster failover tests: the cluster scripts/servers.sh starts (three
// primaries with a replica each, IDEM_TEST_REDIS_CLUSTER_PORTS primaries first), asked node by
// node, and putting it back as it was started after a primary was killed.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redis_nodes_env.hpp"

namespace idem::test::cluster {

using namespace idem::test::redis_nodes;

// Every node of the cluster: primaries first, then their replicas.
inline std::vector<int> cluster_ports() {
  return ports_of("IDEM_TEST_REDIS_CLUSTER_PORTS");
}

// As scripts/servers.sh leaves it: every node sees state ok, the first three ports are primaries
// with their replica online, the other three replicas with their link up.
inline bool cluster_as_started() {
  const auto ports = cluster_ports();
  for (std::size_t i = 0; i < ports.size(); ++i) {
    const auto state = ask(ports[i], {"CLUSTER", "INFO"});
    if (!state || state->str.find("cluster_state:ok") == std::string::npos) return false;
    const auto nodes = ask(ports[i], {"CLUSTER", "NODES"});
    if (!nodes || nodes->str.find("fail") != std::string::npos) return false;
    // Every node's own view has caught up: three primaries, not a fourth from before a failover.
    std::size_t primaries = 0;
    for (std::size_t at = nodes->str.find("master"); at != std::string::npos;
         at = nodes->str.find("master", at + 1)) {
      ++primaries;
    }
    if (primaries != 3) return false;
    if (i < 3 ? !info_has(ports[i], "replication", "connected_slaves:1")
              : !info_has(ports[i], "replication", "master_link_status:up")) {
      return false;
    }
  }
  return true;
}

// The directory of the node at `port` (its redis.pid, redis.conf and nodes.conf).
inline std::string node_dir(int port) {
  return idem::test::env("IDEM_TEST_REDIS_CLUSTER_DIR") + "/" + std::to_string(port);
}

// Kills the node at `port` with SIGKILL; false when its pid cannot be read.
inline bool kill_node(int port) {
  pid_t pid = 0;
  std::ifstream(node_dir(port) + "/redis.pid") >> pid;
  return pid > 0 && ::kill(pid, SIGKILL) == 0;
}

// Starts the killed node at `port` again (it rejoins as the replica of the promoted one), then
// gives it its primary role back (CLUSTER FAILOVER, coordinated: nothing is lost), and waits
// until the cluster is as servers.sh started it.
inline void restore_node(int victim) {
  const std::string dir = node_dir(victim);
  ASSERT_EQ(std::system(("redis-server " + dir + "/redis.conf >/dev/null").c_str()), 0);
  ASSERT_TRUE(poll_until([&] { return info_has(victim, "replication", "master_link_status:up"); }))
      << "the restarted node did not sync as a replica";
  // A manual failover gives up after 5 s when the primary does not pause in time (a loaded
  // machine): ask again until the node is primary and the cluster as started, or 90 s.
  auto asked = Clock::now() - 1h;
  const bool back = poll_until(
      [&] {
        if (cluster_as_started()) return true;
        if (Clock::now() - asked > 6s && info_has(victim, "replication", "master_link_status:up")) {
          const auto failover = ask(victim, {"CLUSTER", "FAILOVER"});
          EXPECT_TRUE(failover && !failover->is_error()) << (failover ? failover->str : "");
          asked = Clock::now();
        }
        return false;
      },
      90s);
  if (!back) {
    std::string state;
    for (int port : cluster_ports()) {
      const auto nodes = ask(port, {"CLUSTER", "NODES"});
      const auto info = ask(port, {"INFO", "replication"});
      state += "--- " + std::to_string(port) + "\n" + (nodes ? nodes->str : "(no answer)") +
               (info ? info->str : "") + "\n";
    }
    ADD_FAILURE() << "the cluster did not come back as started:\n" << state;
  }
}

// Kills the primary at `port` now and puts the cluster back when it goes out of scope, also when
// the test failed in between (later tests share the cluster).
class KilledPrimary {
 public:
  explicit KilledPrimary(int port) : port_(port), killed_(kill_node(port)) {}
  ~KilledPrimary() {
    if (killed_) restore_node(port_);
  }
  KilledPrimary(const KilledPrimary&) = delete;
  KilledPrimary& operator=(const KilledPrimary&) = delete;
  bool killed() const noexcept { return killed_; }

 private:
  int port_;
  bool killed_;
};

// What marking through a failover saw (mark_through_failover).
struct FailoverMarks {
  std::vector<std::string> acknowledged;  // the single marks that succeeded
  int failures = 0;                       // calls that ended with a RedisError
  bool recovered = false;                 // a batch over every slot succeeded
};

// Marks single ids round the keyspace ("during-<i>"; a third of them on a killed primary's slots)
// until a whole batch over every slot (`mark_batch` of 30 "probe-<i>-..." ids, every 20th call)
// succeeds after the promotion, for 60 s at most. Every call must end within `bound`, with
// success or a retryable / in-doubt RedisError.
template <class MarkOne, class MarkBatch>
FailoverMarks mark_through_failover(Clock::duration bound, MarkOne mark_one, MarkBatch mark_batch) {
  FailoverMarks marks;
  const auto limit = Clock::now() + 60s;
  for (int i = 0; !marks.recovered && Clock::now() < limit; ++i) {
    const std::string id = "during-" + std::to_string(i);
    const auto start = Clock::now();
    try {
      mark_one(id);
      marks.acknowledged.push_back(id);
      if (i % 20 == 0) {
        mark_batch(ids("probe-" + std::to_string(i), 30));
        marks.recovered = true;
      }
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
      ++marks.failures;
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_LT(Clock::now() - start, bound) << "call " << i << " did not end in time";
  }
  return marks;
}

}  // namespace idem::test::cluster
