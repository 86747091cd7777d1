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
#include <sqlite3.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "worker/child_process.hpp"

namespace {

constexpr int kWorkers = 4;
constexpr int kKeys = 10'000;
constexpr double kDuplicatedShare = 0.35;
// How long each execution computes after its side effect: the window in which a copy of the key
// from another process finds it in progress.
constexpr int kWorkMicros = 50;

using idem::test::TempDir;

long long query_int(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* stmt = nullptr;
  long long value = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    value = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

struct Plan {
  std::vector<std::string> keys;                // every key, once
  std::vector<std::vector<std::string>> lists;  // what each worker calls, in order
  std::size_t calls = 0;
  std::size_t duplicated_keys = 0;
};

// Deterministic (fixed seed) so a failure can be replayed.
Plan make_plan() {
  Plan plan;
  std::mt19937 random(20261201);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  std::uniform_int_distribution<int> extra_copies(1, kWorkers - 1);
  plan.lists.resize(kWorkers);
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = "payment:" + idem::new_event_id();
    plan.keys.push_back(key);
    std::vector<std::size_t> workers(kWorkers);
    for (std::size_t w = 0; w < workers.size(); ++w)
      workers[w] = w;
    std::shuffle(workers.begin(), workers.end(), random);
    int copies = 1;
    if (share(random) < kDuplicatedShare) {
      copies += extra_copies(random);
      ++plan.duplicated_keys;
    }
    // Same global position in every list that gets it: the copies race each other.
    for (int c = 0; c < copies; ++c) {
      plan.lists[workers[static_cast<std::size_t>(c)]].push_back(key);
      ++plan.calls;
    }
  }
  return plan;
}

struct WorkerResult {
  long executed = 0;
  long replayed = 0;
  long joined = 0;
  long waited = 0;
  long redelivered = 0;
  long takeovers = 0;
  long wrong = 0;
};

WorkerResult parse_summary(const std::string& line) {
  WorkerResult r;
  if (std::sscanf(line.c_str(),
                  "executed=%ld replayed=%ld joined=%ld waited=%ld redelivered=%ld takeovers=%ld "
                  "wrong=%ld",
                  &r.executed, &r.replayed, &r.joined, &r.waited, &r.redelivered, &r.takeovers,
                  &r.wrong) != 7) {
    ADD_FAILURE() << "unexpected worker output: '" << line << "'";
  }
  return r;
}

class SqliteStoreMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    plan_ = make_plan();
    ASSERT_GE(static_cast<double>(plan_.duplicated_keys), 0.30 * kKeys);
    db_ = dir_.file("shared.db");
    effects_ = dir_.file("effects.txt");
    // Created once up front, as a deployment would; the workers open the existing file.
    idem::sqlite::SqliteIdempotencyStore create(db_);
  }

  // Runs the plan with kWorkers processes under `policy`; returns their summaries.
  std::vector<WorkerResult> run_workers(const std::string& policy) {
    std::vector<std::unique_ptr<idem::test::ChildProcess>> workers;
    for (std::size_t w = 0; w < kWorkers; ++w) {
      const std::string keys = dir_.file("keys-" + std::to_string(w) + ".txt");
      {
        std::ofstream out(keys);
        for (const auto& key : plan_.lists[w])
          out << key << "\n";
      }
      workers.push_back(std::make_unique<idem::test::ChildProcess>(std::vector<std::string>{
          IDEM_SQLITE_STORE_WORKER, "run", "--db", db_, "--keys", keys, "--effects", effects_,
          "--policy", policy, "--work-us", std::to_string(kWorkMicros), "--wait-go"}));
    }
    for (auto& worker : workers)
      worker->write_stdin("g");  // start together
    std::vector<WorkerResult> results;
    for (auto& worker : workers) {
      const std::string output = worker->read_all();
      const int status = worker->wait();
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "worker " << worker->pid() << " ended with status " << status;
      results.push_back(parse_summary(output.substr(0, output.find('\n'))));
    }
    return results;
  }

  void expect_each_key_executed_once(const std::vector<WorkerResult>& results) {
    WorkerResult total;
    for (const auto& r : results) {
      total.executed += r.executed;
      total.replayed += r.replayed;
      total.joined += r.joined;
      total.waited += r.waited;
      total.redelivered += r.redelivered;
      total.takeovers += r.takeovers;
      total.wrong += r.wrong;
    }
    EXPECT_EQ(total.executed, kKeys) << "calls that reported executing";
    EXPECT_EQ(total.executed + total.replayed + total.joined, static_cast<long>(plan_.calls))
        << "every call ends executed or replayed";
    EXPECT_EQ(total.wrong, 0) << "a replay must return the executed value";
    EXPECT_EQ(total.takeovers, 0) << "no owner died, so no claim may be taken over";

    std::map<std::string, int> runs;
    std::set<std::string> pids;
    {
      std::ifstream in(effects_);
      for (std::string key, pid; in >> key >> pid;) {
        ++runs[key];
        pids.insert(pid);
      }
    }
    EXPECT_EQ(runs.size(), static_cast<std::size_t>(kKeys));
    int wrong = 0;
    for (const auto& key : plan_.keys) {
      const int n = runs.count(key) != 0 ? runs[key] : 0;
      if (n != 1 && ++wrong <= 5) ADD_FAILURE() << "key " << key << " executed " << n << " times";
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_GE(pids.size(), 2u) << "the work was spread over the processes";
    EXPECT_EQ(query_int(db_, "SELECT count(*) FROM idem_records WHERE state = 'completed'"), kKeys);
    EXPECT_EQ(query_int(db_, "SELECT count(*) FROM idem_records WHERE state != 'completed'"), 0)
        << "every claim completed";
    // How often a copy met another process's owner mid-run (waited for it, or was refused and
    // called again): proof that the copies raced, not just arrived late.
    std::printf("calls=%zu executed=%ld replayed=%ld waited=%ld redelivered=%ld\n", plan_.calls,
                total.executed, total.replayed, total.waited, total.redelivered);
  }

  TempDir dir_;
  std::string db_;
  std::string effects_;
  Plan plan_;
};

TEST_F(SqliteStoreMultiProcess, WaitPolicyExecutesEveryKeyOnceAndReplaysIt) {
  expect_each_key_executed_once(run_workers("wait"));
}

TEST_F(SqliteStoreMultiProcess, RejectPolicyExecutesEveryKeyOnceAcrossRedeliveries) {
  expect_each_key_executed_once(run_workers("reject"));
}

}  // namespace
