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

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "../temp_dir.hpp"
#include "idem/operation_idempotency.hpp"
#include "worker_process.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using idem::test::TempDir;

// Runs one worker per list (started together), each appending the items whose side effect it
// ran to its file of `effects`; returns their summary lines.
std::vector<std::string> run_workers(const TempDir& dir, const idem::test::DeliveryPlan& plan,
                                     const std::vector<std::string>& command,
                                     const std::vector<std::string>& effects) {
  const auto lists = idem::test::per_worker_files(dir, "list", idem::test::kPlanWorkers);
  std::vector<std::vector<std::string>> argvs;
  for (std::size_t w = 0; w < lists.size(); ++w) {
    std::vector<std::string> argv = command;
    argv.insert(argv.end(), {command[1] == "consume" ? "--events" : "--keys",
                             idem::test::write_lines(lists[w], plan.lists[w]), "--effects",
                             effects[w], "--wait-go"});
    argvs.push_back(std::move(argv));
  }
  return idem::test::run_together(argvs);
}

std::size_t count_with(const std::vector<std::string>& keys, const std::string& infix) {
  return static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](const auto& key) {
    return key.find(infix) != std::string::npos;
  }));
}

class RedisMultiProcess : public ::testing::Test {
 protected:
  TempDir dir_;
  std::vector<std::string> effects_ =
      idem::test::per_worker_files(dir_, "effects", idem::test::kPlanWorkers);
  idem::test::RedisTestPrefix keys_{"multiprocess"};
};

TEST_F(RedisMultiProcess, ExclusiveHandlersRunEverySideEffectOnce) {
  // Deterministic (fixed seed) apart from the ids, so a failure can be replayed.
  const idem::test::DeliveryPlan plan = idem::test::make_delivery_plan(20261201);
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * idem::test::kPlanItems);
  idem::test::expect_consumer_totals(
      run_workers(dir_, plan,
                  {IDEM_REDIS_WORKER, "consume", "--url", idem::test::redis_url(), "--prefix",
                   keys_.prefix(), "--consumer", "inventory"},
                  effects_),
      plan);
  idem::test::expect_each_once(idem::test::count_runs(effects_), plan.items);

  const auto keys = keys_.keys();
  EXPECT_EQ(count_with(keys, "m:{inventory:"), static_cast<std::size_t>(idem::test::kPlanItems));
  EXPECT_EQ(count_with(keys, "c:{inventory:"), 0u) << "every claim completed";
}

TEST_F(RedisMultiProcess, ResilientCallsRunEveryKeyOnceAndReplayIt) {
  const idem::test::DeliveryPlan plan = idem::test::make_delivery_plan(20261201, "order:");
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * idem::test::kPlanItems);
  const auto total =
      idem::test::sum_counts(run_workers(dir_, plan,
                                         {IDEM_REDIS_WORKER, "run-keys", "--url",
                                          idem::test::redis_url(), "--prefix", keys_.prefix()},
                                         effects_),
                             {"executed", "replayed", "joined", "redelivered", "took_over"});
  EXPECT_EQ(total.at("took_over"), 0) << "no owner died, so no lease may have been taken over";
  EXPECT_EQ(total.at("executed"), idem::test::kPlanItems);
  EXPECT_EQ(total.at("executed") + total.at("replayed") + total.at("joined"),
            static_cast<long>(plan.deliveries));
  std::printf("deliveries=%zu executed=%ld replayed=%ld joined=%ld redelivered=%ld\n",
              plan.deliveries, total.at("executed"), total.at("replayed"), total.at("joined"),
              total.at("redelivered"));
  idem::test::expect_each_once(idem::test::count_runs(effects_), plan.items);
  // The worker's operation is named "redis-worker": its keys are stored in that scope.
  EXPECT_EQ(
      count_with(keys_.keys(), "s:{" + idem::scoped_idempotency_key("redis-worker", "order:")),
      static_cast<std::size_t>(idem::test::kPlanItems));
}

}  // namespace
