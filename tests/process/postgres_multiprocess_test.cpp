// Several processes, one PostgreSQL database: every event's side effect, and every keyed
// operation, happens exactly once.
//
// 4 worker processes (this binary, started as `--postgres-worker ...`) share one schema.
//   consumers:   10,000 events, 35% of them delivered 2 to 4 times — to different workers, at
//                the same position of every worker's list, so the copies race for the claim in
//                different processes. Refused deliveries (AlreadyInProgress) are redelivered.
//                Side effects are counted where markers cannot vouch for them: exclusive mode
//                appends to per-worker files, transactional mode inserts rows (no unique key) in
//                side_effects through the transaction.
//   operations:  10,000 keys through resilient() on PostgresIdempotencyStore, duplicated the
//                same way; the operation records each execution in a table of its own (outside
//                idem's transaction), every caller writes down the value it got back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "postgres_worker.hpp"
#include "worker/child_process.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace pg = idem::test::pg;

constexpr int kWorkers = 4;
constexpr int kItems = 10'000;
constexpr double kDuplicatedShare = 0.35;

using idem::test::TempDir;

struct Plan {
  std::vector<std::string> ids;                 // every item, once
  std::vector<std::vector<std::string>> lists;  // what each worker gets, in order
  std::size_t deliveries = 0;
  std::size_t duplicated = 0;
};

// Deterministic (fixed seed) so a failure can be replayed.
Plan make_plan(const std::string& prefix) {
  Plan plan;
  std::mt19937 random(20261130);
  std::uniform_real_distribution<double> share(0.0, 1.0);
  std::uniform_int_distribution<int> extra_copies(1, kWorkers - 1);
  plan.lists.resize(kWorkers);
  for (int i = 0; i < kItems; ++i) {
    const std::string id = prefix + idem::new_event_id();
    plan.ids.push_back(id);
    std::vector<int> workers = {0, 1, 2, 3};
    std::shuffle(workers.begin(), workers.end(), random);
    int copies = 1;
    if (share(random) < kDuplicatedShare) {
      copies += extra_copies(random);
      ++plan.duplicated;
    }
    for (int c = 0; c < copies; ++c) {
      plan.lists[static_cast<std::size_t>(workers[static_cast<std::size_t>(c)])].push_back(id);
      ++plan.deliveries;
    }
  }
  return plan;
}

// Starts one worker per list with `args` (+ the list's file), releases them together and
// returns their one-line summaries.
std::vector<std::string> run_workers(const TempDir& dir, const Plan& plan,
                                     const std::vector<std::string>& args,
                                     const std::string& list_flag, const std::string& tag) {
  std::vector<std::unique_ptr<idem::test::ChildProcess>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    const std::string list = dir.file(tag + "-list-" + std::to_string(w) + ".txt");
    {
      std::ofstream out(list);
      for (const auto& id : plan.lists[static_cast<std::size_t>(w)])
        out << id << "\n";
    }
    std::vector<std::string> argv = {idem::test::pg_worker::self_path(), "--postgres-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const std::string& extra :
         {list_flag, list, std::string("--worker"), "w" + std::to_string(w)}) {
      argv.push_back(extra);
    }
    if (tag == "exclusive") {
      argv.push_back("--effects");
      argv.push_back(dir.file("effects-" + std::to_string(w) + ".txt"));
    }
    argv.push_back("--wait-go");
    workers.push_back(std::make_unique<idem::test::ChildProcess>(argv));
  }
  for (auto& worker : workers)
    worker->write_stdin("g");  // start together
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

class PostgresMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    // Created once up front, as a deployment would; the workers open existing tables.
    idem::postgres::PostgresIdempotencyRecorder recorder(schema_.options());
    idem::postgres::PostgresIdempotencyStore store(schema_.options());
    pg::query("CREATE TABLE " + schema_.table("side_effects") +
              " (event_id text NOT NULL, worker text NOT NULL)");
    pg::query("CREATE TABLE " + schema_.table("executions") +
              " (key text NOT NULL, worker text NOT NULL)");
  }

  long long count(const std::string& sql) const { return pg::query_int(sql); }

  // Every delivery ended processed or duplicate, and exactly one per event was processed.
  void expect_consumer_totals(const std::vector<std::string>& summaries, const Plan& plan) {
    long processed = 0;
    long duplicate = 0;
    long redelivered = 0;
    for (const std::string& line : summaries) {
      long p = 0;
      long d = 0;
      long r = 0;
      if (std::sscanf(line.c_str(), "processed=%ld duplicate=%ld redelivered=%ld", &p, &d, &r) !=
          3) {
        ADD_FAILURE() << "unexpected worker output: '" << line << "'";
      }
      processed += p;
      duplicate += d;
      redelivered += r;
    }
    EXPECT_EQ(processed, kItems) << "handlers that reported running";
    EXPECT_EQ(processed + duplicate, static_cast<long>(plan.deliveries));
    std::printf("deliveries=%zu processed=%ld duplicate=%ld redelivered=%ld\n", plan.deliveries,
                processed, duplicate, redelivered);
  }

  pg::TempSchema schema_;
  TempDir dir_;
};

TEST_F(PostgresMultiProcess, ExclusiveModeRunsEverySideEffectOnce) {
  const Plan plan = make_plan("");
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * kItems);
  const auto summaries = run_workers(
      dir_, plan,
      {"consume", "--schema", schema_.name(), "--mode", "exclusive", "--consumer", "inventory"},
      "--events", "exclusive");
  expect_consumer_totals(summaries, plan);
  std::map<std::string, int> runs;
  for (int w = 0; w < kWorkers; ++w) {
    std::ifstream in(dir_.file("effects-" + std::to_string(w) + ".txt"));
    for (std::string id; std::getline(in, id);)
      ++runs[id];
  }
  EXPECT_EQ(runs.size(), static_cast<std::size_t>(kItems));
  int wrong = 0;
  for (const auto& id : plan.ids) {
    const int n = runs.count(id) != 0 ? runs[id] : 0;
    if (n != 1 && ++wrong <= 5) ADD_FAILURE() << "event " << id << " ran " << n << " times";
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.table("processed_log") +
                  " WHERE consumer = 'inventory'"),
            kItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.table("claims") + " WHERE done_at IS NULL"), 0)
      << "every claim completed";
}

TEST_F(PostgresMultiProcess, TransactionalModeRunsEverySideEffectOnce) {
  const Plan plan = make_plan("");
  const auto summaries = run_workers(
      dir_, plan,
      {"consume", "--schema", schema_.name(), "--mode", "transactional", "--consumer", "inventory"},
      "--events", "transactional");
  expect_consumer_totals(summaries, plan);
  const std::string side = schema_.table("side_effects");
  const std::string log = schema_.table("processed_log");
  EXPECT_EQ(count("SELECT count(*) FROM " + side), kItems);
  EXPECT_EQ(count("SELECT count(DISTINCT event_id) FROM " + side), kItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + log + " WHERE consumer = 'inventory'"), kItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + log + " p LEFT JOIN " + side +
                  " s ON s.event_id = p.event_id WHERE s.event_id IS NULL"),
            0)
      << "every marker has its side effect";
  EXPECT_GE(count("SELECT count(DISTINCT worker) FROM " + side), 2)
      << "the work was spread over the processes";
}

TEST_F(PostgresMultiProcess, KeyedOperationsExecuteOnceAcrossProcesses) {
  const Plan plan = make_plan("op:");
  const auto summaries =
      run_workers(dir_, plan, {"operations", "--schema", schema_.name()}, "--keys", "operations");
  long executed = 0;
  long replayed = 0;
  long waits = 0;
  long notified = 0;
  for (const std::string& line : summaries) {
    long e = 0;
    long r = 0;
    long j = 0;
    long w = 0;
    long n = 0;
    if (std::sscanf(line.c_str(), "executed=%ld replayed=%ld joined=%ld waits=%ld notified=%ld", &e,
                    &r, &j, &w, &n) != 5) {
      ADD_FAILURE() << "unexpected worker output: '" << line << "'";
    }
    executed += e;
    replayed += r;
    waits += w;
    notified += n;
  }
  EXPECT_EQ(executed, kItems);
  EXPECT_EQ(executed + replayed, static_cast<long>(plan.deliveries));
  std::printf("calls=%zu executed=%ld replayed=%ld waits=%ld woken_by_notify=%ld\n",
              plan.deliveries, executed, replayed, waits, notified);

  const std::string executions = schema_.table("executions");
  EXPECT_EQ(count("SELECT count(*) FROM " + executions), kItems) << "each operation ran once";
  EXPECT_EQ(count("SELECT count(DISTINCT key) FROM " + executions), kItems);
  // Every caller, in every process, got the value of the one execution.
  std::map<std::string, std::string> value_of;
  int mismatches = 0;
  for (int w = 0; w < kWorkers; ++w) {
    std::ifstream in(dir_.file("operations-list-" + std::to_string(w) + ".txt.out"));
    for (std::string key, value, status; in >> key >> value >> status;) {
      const auto [it, inserted] = value_of.emplace(key, value);
      if (!inserted && it->second != value && ++mismatches <= 5) {
        ADD_FAILURE() << key << ": " << it->second << " vs " << value;
      }
    }
  }
  EXPECT_EQ(value_of.size(), static_cast<std::size_t>(kItems));
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(
      count("SELECT count(*) FROM " + schema_.table("records") + " WHERE state <> 'completed'"), 0);
}

}  // namespace

IDEM_POSTGRES_WORKER_MAIN()
