// Several processes, one Redis server: every side effect happens exactly once.
//
// 4 worker processes (idem_test_redis_worker) share one server and key prefix. 10,000 events
// (or keys) are delivered with 35% of them delivered more than once — to 2 to 4 of the workers —
// and every worker walks its list in the same global order, so the copies of one event arrive at
// about the same time in different processes (real races for the claim, not just late
// duplicates).
//   recorder: exclusive-mode IdempotentHandler on RedisIdempotencyRecorder; a delivery refused
//             with AlreadyInProgress goes back to the worker's queue, as a broker would redeliver;
//   store:    idem::resilient() with idempotency on RedisIdempotencyStore; a copy that finds the
//             key running in another process waits for it and replays its value.
// Each worker appends the ids whose side effect it ran to its own file (O_APPEND); the test
// merges the files and counts.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/operation_idempotency.hpp"
#include "worker/child_process.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

constexpr int kWorkers = 4;
constexpr int kItems = 10'000;
constexpr double kDuplicatedShare = 0.35;

using idem::test::TempDir;

struct Plan {
  std::vector<std::string> items;               // every event id / key, once
  std::vector<std::vector<std::string>> lists;  // what each worker gets, in order
  std::size_t deliveries = 0;
  std::size_t duplicated = 0;
};

// Deterministic (fixed seed) apart from the ids, so a failure can be replayed.
Plan make_plan(const std::string& item_prefix) {
  Plan plan;
  std::mt19937 random(20261201);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  std::uniform_int_distribution<int> extra_copies(1, kWorkers - 1);
  plan.lists.resize(kWorkers);
  for (int i = 0; i < kItems; ++i) {
    const std::string item = item_prefix + idem::new_event_id();
    plan.items.push_back(item);
    std::vector<std::size_t> workers(kWorkers);
    for (std::size_t w = 0; w < workers.size(); ++w)
      workers[w] = w;
    std::shuffle(workers.begin(), workers.end(), random);
    int copies = 1;
    if (share(random) < kDuplicatedShare) {
      copies += extra_copies(random);
      ++plan.duplicated;
    }
    for (int c = 0; c < copies; ++c) {
      plan.lists[workers[static_cast<std::size_t>(c)]].push_back(item);
      ++plan.deliveries;
    }
  }
  return plan;
}

// Runs one worker per list (started together) and returns their summary lines.
std::vector<std::string> run_workers(const TempDir& dir, const Plan& plan,
                                     const std::vector<std::string>& command) {
  std::vector<std::unique_ptr<idem::test::ChildProcess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    const std::string list = dir.file("list-" + std::to_string(w) + ".txt");
    {
      std::ofstream out(list);
      for (const auto& item : plan.lists[static_cast<std::size_t>(w)])
        out << item << "\n";
    }
    std::vector<std::string> argv = command;
    argv.insert(argv.end(), {command[1] == "consume" ? "--events" : "--keys", list, "--effects",
                             dir.file("effects-" + std::to_string(w) + ".txt"), "--wait-go"});
    workers.push_back(std::make_unique<idem::test::ChildProcess>(argv));
  }
  for (auto& worker : workers)
    worker->write_stdin("g");
  std::vector<std::string> summaries;
  for (auto& worker : workers) {
    const std::string output = worker->read_all();
    const int status = worker->wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << worker->pid() << " ended with status " << status;
    summaries.push_back(output.substr(0, output.find('\n')));
  }
  return summaries;
}

// How often each item's side effect ran, over every worker's effects file.
std::map<std::string, int> side_effects(const TempDir& dir) {
  std::map<std::string, int> runs;
  for (int w = 0; w < kWorkers; ++w) {
    std::ifstream in(dir.file("effects-" + std::to_string(w) + ".txt"));
    for (std::string item; std::getline(in, item);)
      ++runs[item];
  }
  return runs;
}

void expect_each_once(const std::map<std::string, int>& runs, const Plan& plan) {
  EXPECT_EQ(runs.size(), plan.items.size());
  int wrong = 0;
  for (const auto& item : plan.items) {
    const auto it = runs.find(item);
    const int n = it == runs.end() ? 0 : it->second;
    if (n != 1 && ++wrong <= 5) ADD_FAILURE() << item << " ran " << n << " times";
  }
  EXPECT_EQ(wrong, 0);
}

std::size_t count_with(const std::vector<std::string>& keys, const std::string& infix) {
  return static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](const auto& key) {
    return key.find(infix) != std::string::npos;
  }));
}

class RedisMultiProcess : public ::testing::Test {
 protected:
  TempDir dir_;
  idem::test::RedisTestPrefix keys_{"multiprocess"};
};

TEST_F(RedisMultiProcess, ExclusiveHandlersRunEverySideEffectOnce) {
  const Plan plan = make_plan("");
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * kItems);
  const auto summaries =
      run_workers(dir_, plan,
                  {IDEM_REDIS_WORKER, "consume", "--url", idem::test::redis_url(), "--prefix",
                   keys_.prefix(), "--consumer", "inventory"});
  long processed = 0;
  long duplicate = 0;
  long redelivered = 0;
  for (const auto& summary : summaries) {
    long p = 0, d = 0, r = 0;
    ASSERT_EQ(
        std::sscanf(summary.c_str(), "processed=%ld duplicate=%ld redelivered=%ld", &p, &d, &r), 3)
        << summary;
    processed += p;
    duplicate += d;
    redelivered += r;
  }
  EXPECT_EQ(processed, kItems) << "handlers that reported running";
  EXPECT_EQ(processed + duplicate, static_cast<long>(plan.deliveries));
  std::printf("deliveries=%zu processed=%ld duplicate=%ld redelivered=%ld\n", plan.deliveries,
              processed, duplicate, redelivered);
  expect_each_once(side_effects(dir_), plan);

  const auto keys = keys_.keys();
  EXPECT_EQ(count_with(keys, "m:{inventory:"), static_cast<std::size_t>(kItems));
  EXPECT_EQ(count_with(keys, "c:{inventory:"), 0u) << "every claim completed";
}

TEST_F(RedisMultiProcess, ResilientCallsRunEveryKeyOnceAndReplayIt) {
  const Plan plan = make_plan("order:");
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * kItems);
  const auto summaries = run_workers(dir_, plan,
                                     {IDEM_REDIS_WORKER, "run-keys", "--url",
                                      idem::test::redis_url(), "--prefix", keys_.prefix()});
  long executed = 0;
  long replayed = 0;
  long joined = 0;
  long redelivered = 0;
  for (const auto& summary : summaries) {
    long e = 0, r = 0, j = 0, d = 0, t = 0;
    ASSERT_EQ(std::sscanf(summary.c_str(),
                          "executed=%ld replayed=%ld joined=%ld redelivered=%ld "
                          "took_over=%ld",
                          &e, &r, &j, &d, &t),
              5)
        << summary;
    executed += e;
    replayed += r;
    joined += j;
    redelivered += d;
    EXPECT_EQ(t, 0) << "no owner died, so no lease may have been taken over";
  }
  EXPECT_EQ(executed, kItems);
  EXPECT_EQ(executed + replayed + joined, static_cast<long>(plan.deliveries));
  std::printf("deliveries=%zu executed=%ld replayed=%ld joined=%ld redelivered=%ld\n",
              plan.deliveries, executed, replayed, joined, redelivered);
  expect_each_once(side_effects(dir_), plan);
  // The worker's operation is named "redis-worker": its keys are stored in that scope.
  EXPECT_EQ(
      count_with(keys_.keys(), "s:{" + idem::scoped_idempotency_key("redis-worker", "order:")),
      static_cast<std::size_t>(kItems));
}

}  // namespace
