// Several processes, one SQLite file: every event's side effect happens exactly once.
//
// 4 worker processes (idem_test_worker consume) share one database. 10,000 events are delivered
// with 35% of them delivered more than once — to 2 to 4 of the workers — and every worker walks
// the events in the same global order, so the copies of one event arrive at about the same time
// in different processes (real races for the claim, not just late duplicates). A refused
// delivery (AlreadyInProgress) goes back into the worker's queue, as a broker would redeliver it.
//
// The side effects are counted where the markers cannot vouch for them:
//   exclusive mode:     each worker appends the ids it handled to its own file (O_APPEND); the
//                       test merges the files and counts,
//   transactional mode: the handler inserts a row in side_effects through the transaction; the
//                       table has no unique key, so a double run would show as two rows.
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
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "worker/child_process.hpp"

namespace {

constexpr int kWorkers = 4;
constexpr int kEvents = 10'000;
constexpr double kDuplicatedShare = 0.35;

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

void exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_busy_timeout(db, 5000);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  if (rc != SQLITE_OK) throw std::runtime_error("exec failed: " + message);
}

struct Plan {
  std::vector<std::string> ids;                 // every event, once
  std::vector<std::vector<std::string>> lists;  // what each worker is delivered, in order
  std::size_t deliveries = 0;
  std::size_t duplicated_events = 0;
};

// Deterministic (fixed seed) so a failure can be replayed.
Plan make_plan() {
  Plan plan;
  std::mt19937 random(20261130);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  std::uniform_int_distribution<int> extra_copies(1, kWorkers - 1);
  plan.lists.resize(kWorkers);
  for (int i = 0; i < kEvents; ++i) {
    const std::string id = idem::new_event_id();
    plan.ids.push_back(id);
    std::vector<int> workers(kWorkers);
    for (int w = 0; w < kWorkers; ++w)
      workers[static_cast<std::size_t>(w)] = w;
    std::shuffle(workers.begin(), workers.end(), random);
    int copies = 1;
    if (share(random) < kDuplicatedShare) {
      copies += extra_copies(random);
      ++plan.duplicated_events;
    }
    // Same global position in every list that gets it: the copies race each other.
    for (int c = 0; c < copies; ++c) {
      plan.lists[static_cast<std::size_t>(workers[static_cast<std::size_t>(c)])].push_back(id);
      ++plan.deliveries;
    }
  }
  return plan;
}

struct WorkerResult {
  long processed = 0;
  long duplicate = 0;
  long redelivered = 0;
};

WorkerResult parse_summary(const std::string& line) {
  WorkerResult r;
  if (std::sscanf(line.c_str(), "processed=%ld duplicate=%ld redelivered=%ld", &r.processed,
                  &r.duplicate, &r.redelivered) != 3) {
    ADD_FAILURE() << "unexpected worker output: '" << line << "'";
  }
  return r;
}

// Runs the plan with kWorkers processes in `mode`; returns their summaries.
std::vector<WorkerResult> run_workers(const TempDir& dir, const std::string& db,
                                      const std::string& mode, const Plan& plan) {
  std::vector<std::unique_ptr<idem::test::ChildProcess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    const std::string events = dir.file(mode + "-events-" + std::to_string(w) + ".txt");
    {
      std::ofstream out(events);
      for (const auto& id : plan.lists[static_cast<std::size_t>(w)])
        out << id << "\n";
    }
    std::vector<std::string> argv = {
        IDEM_TEST_WORKER, "consume", "--db",       db,          "--mode",   mode,
        "--events",       events,    "--consumer", "inventory", "--worker", "w" + std::to_string(w),
        "--wait-go"};
    if (mode == "exclusive") {
      argv.push_back("--effects");
      argv.push_back(dir.file("effects-" + std::to_string(w) + ".txt"));
    }
    workers.push_back(std::make_unique<idem::test::ChildProcess>(argv));
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

void expect_totals(const std::vector<WorkerResult>& results, const Plan& plan) {
  long processed = 0;
  long duplicate = 0;
  long redelivered = 0;
  for (const auto& r : results) {
    processed += r.processed;
    duplicate += r.duplicate;
    redelivered += r.redelivered;
  }
  EXPECT_EQ(processed, kEvents) << "handlers that reported running";
  EXPECT_EQ(processed + duplicate, static_cast<long>(plan.deliveries))
      << "every delivery ends processed or duplicate";
  // How often a copy met another process mid-run (AlreadyInProgress, redelivered): proof that
  // the copies raced, not just arrived late.
  std::printf("deliveries=%zu processed=%ld duplicate=%ld redelivered=%ld\n", plan.deliveries,
              processed, duplicate, redelivered);
}

class SqliteMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    plan_ = make_plan();
    ASSERT_GE(static_cast<double>(plan_.duplicated_events), 0.30 * kEvents);
    db_ = dir_.file("shared.db");
    // Created once up front, as a deployment would; the workers open the existing file.
    idem::sqlite::SqliteIdempotencyRecorder create(db_);
    exec(db_, "CREATE TABLE side_effects(event_id TEXT NOT NULL, worker TEXT NOT NULL)");
  }

  TempDir dir_;
  std::string db_;
  Plan plan_;
};

TEST_F(SqliteMultiProcess, ExclusiveModeRunsEverySideEffectOnce) {
  const auto results = run_workers(dir_, db_, "exclusive", plan_);
  expect_totals(results, plan_);

  std::map<std::string, int> runs;
  for (int w = 0; w < kWorkers; ++w) {
    std::ifstream in(dir_.file("effects-" + std::to_string(w) + ".txt"));
    for (std::string id; std::getline(in, id);)
      ++runs[id];
  }
  EXPECT_EQ(runs.size(), static_cast<std::size_t>(kEvents));
  int wrong = 0;
  for (const auto& id : plan_.ids) {
    const int n = runs.count(id) != 0 ? runs[id] : 0;
    if (n != 1 && ++wrong <= 5) ADD_FAILURE() << "event " << id << " ran " << n << " times";
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM processed_log WHERE consumer = 'inventory'"),
            kEvents);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM idem_claims"), 0) << "every claim completed";
}

TEST_F(SqliteMultiProcess, TransactionalModeRunsEverySideEffectOnce) {
  const auto results = run_workers(dir_, db_, "transactional", plan_);
  expect_totals(results, plan_);

  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM side_effects"), kEvents);
  EXPECT_EQ(query_int(db_, "SELECT count(DISTINCT event_id) FROM side_effects"), kEvents);
  EXPECT_EQ(query_int(db_, "SELECT count(*) FROM processed_log WHERE consumer = 'inventory'"),
            kEvents);
  // Each side effect has its marker and each marker its side effect.
  EXPECT_EQ(query_int(db_,
                      "SELECT count(*) FROM processed_log p LEFT JOIN side_effects s ON "
                      "s.event_id = p.event_id WHERE s.event_id IS NULL"),
            0);
  // The work was spread over the processes, not done by one.
  EXPECT_GE(query_int(db_, "SELECT count(DISTINCT worker) FROM side_effects"), 2);
}

}  // namespace
