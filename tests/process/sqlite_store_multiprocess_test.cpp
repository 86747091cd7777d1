// Several processes, one SQLite file, idempotent operations through resilient(): every key's
// operation executes exactly once.
//
// 4 worker processes (idem_test_sqlite_store_worker run) share one SqliteIdempotencyStore file.
// 10,000 keys are called, 35% of them by 2 to 4 of the workers, and every worker walks the keys in
// the same global order, so the copies of one key arrive at about the same time in different
// processes: real races for the claim, and callers that find the key in progress in another
// process (they wait for it and replay, or — reject policy — are refused and call again later).
// Each execution appends "<key> <pid>" to one shared effects file (O_APPEND), which the test
// counts: the store cannot vouch for itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "worker_process.hpp"

namespace {

// How long each execution computes after its side effect: the window in which a copy of the key
// from another process finds it in progress.
constexpr int kWorkMicros = 50;

using idem::test::TempDir;

class SqliteStoreMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    plan_ = idem::test::make_delivery_plan(20261201, "payment:");
    ASSERT_GE(static_cast<double>(plan_.duplicated), 0.30 * idem::test::kPlanItems);
    db_ = dir_.file("shared.db");
    effects_ = dir_.file("effects.txt");
    // Created once up front, as a deployment would; the workers open the existing file.
    idem::sqlite::SqliteIdempotencyStore create(db_);
  }

  // Runs the plan with one process per list under `policy`; returns their summaries.
  std::vector<std::string> run_workers(const std::string& policy) {
    const auto keys = idem::test::per_worker_files(dir_, "keys", idem::test::kPlanWorkers);
    std::vector<std::vector<std::string>> argvs;
    for (std::size_t w = 0; w < keys.size(); ++w) {
      argvs.push_back({IDEM_SQLITE_STORE_WORKER, "run", "--db", db_, "--keys",
                       idem::test::write_lines(keys[w], plan_.lists[w]), "--effects", effects_,
                       "--policy", policy, "--work-us", std::to_string(kWorkMicros), "--wait-go"});
    }
    return idem::test::run_together(argvs);
  }

  void expect_each_key_executed_once(const std::vector<std::string>& summaries) {
    const auto total = idem::test::sum_counts(
        summaries,
        {"executed", "replayed", "joined", "waited", "redelivered", "takeovers", "wrong"});
    EXPECT_EQ(total.at("executed"), idem::test::kPlanItems) << "calls that reported executing";
    EXPECT_EQ(total.at("executed") + total.at("replayed") + total.at("joined"),
              static_cast<long>(plan_.deliveries))
        << "every call ends executed or replayed";
    EXPECT_EQ(total.at("wrong"), 0) << "a replay must return the executed value";
    EXPECT_EQ(total.at("takeovers"), 0) << "no owner died, so no claim may be taken over";

    std::map<std::string, int> runs;
    std::set<std::string> pids;
    {
      std::ifstream in(effects_);
      for (std::string key, pid; in >> key >> pid;) {
        ++runs[key];
        pids.insert(pid);
      }
    }
    idem::test::expect_each_once(runs, plan_.items);
    EXPECT_GE(pids.size(), 2u) << "the work was spread over the processes";
    EXPECT_EQ(idem::test::sqlite_query_int(
                  db_, "SELECT count(*) FROM idem_records WHERE state = 'completed'"),
              idem::test::kPlanItems);
    EXPECT_EQ(idem::test::sqlite_query_int(
                  db_, "SELECT count(*) FROM idem_records WHERE state != 'completed'"),
              0)
        << "every claim completed";
    // How often a copy met another process's owner mid-run (waited for it, or was refused and
    // called again): proof that the copies raced, not just arrived late.
    std::printf("calls=%zu executed=%ld replayed=%ld waited=%ld redelivered=%ld\n",
                plan_.deliveries, total.at("executed"), total.at("replayed"), total.at("waited"),
                total.at("redelivered"));
  }

  TempDir dir_;
  std::string db_;
  std::string effects_;
  idem::test::DeliveryPlan plan_;
};

TEST_F(SqliteStoreMultiProcess, WaitPolicyExecutesEveryKeyOnceAndReplaysIt) {
  expect_each_key_executed_once(run_workers("wait"));
}

TEST_F(SqliteStoreMultiProcess, RejectPolicyExecutesEveryKeyOnceAcrossRedeliveries) {
  expect_each_key_executed_once(run_workers("reject"));
}

}  // namespace
