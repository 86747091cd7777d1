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

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "../temp_dir.hpp"
#include "postgres_worker.hpp"
#include "worker_process.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace pg = idem::test::pg;

using idem::test::TempDir;

// Deterministic (fixed seed) apart from the ids, so a failure can be replayed.
idem::test::DeliveryPlan make_plan(const std::string& prefix) {
  return idem::test::make_delivery_plan(20261130, prefix);
}

// Starts one worker per list with `args` (+ the list's file), releases them together and
// returns their one-line summaries. The lists are "<tag>-list-<w>.txt" (the operations worker
// writes what each call got back beside its list, in "<list>.out").
std::vector<std::string> run_workers(const TempDir& dir, const idem::test::DeliveryPlan& plan,
                                     const std::vector<std::string>& args,
                                     const std::string& list_flag, const std::string& tag) {
  const auto lists = idem::test::per_worker_files(dir, tag + "-list", idem::test::kPlanWorkers);
  const auto effects = idem::test::per_worker_files(dir, "effects", idem::test::kPlanWorkers);
  std::vector<std::vector<std::string>> argvs;
  for (std::size_t w = 0; w < lists.size(); ++w) {
    std::vector<std::string> argv = {idem::test::pg_worker::self_path(), "--postgres-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {list_flag, idem::test::write_lines(lists[w], plan.lists[w]),
                             "--worker", "w" + std::to_string(w)});
    if (tag == "exclusive") argv.insert(argv.end(), {"--effects", effects[w]});
    argv.push_back("--wait-go");
    argvs.push_back(std::move(argv));
  }
  return idem::test::run_together(argvs);
}

class PostgresMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    // Created once up front, as a deployment would; the workers open existing tables.
    idem::test::pg_worker::create_tables(schema_);
    pg::query("CREATE TABLE " + schema_.table("executions") +
              " (key text NOT NULL, worker text NOT NULL)");
  }

  long long count(const std::string& sql) const { return pg::query_int(sql); }

  pg::TempSchema schema_;
  TempDir dir_;
};

TEST_F(PostgresMultiProcess, ExclusiveModeRunsEverySideEffectOnce) {
  const idem::test::DeliveryPlan plan = make_plan("");
  ASSERT_GE(static_cast<double>(plan.duplicated), 0.30 * idem::test::kPlanItems);
  idem::test::expect_consumer_totals(run_workers(dir_, plan,
                                                 {"consume", "--schema", schema_.name(), "--mode",
                                                  "exclusive", "--consumer", "inventory"},
                                                 "--events", "exclusive"),
                                     plan);
  idem::test::expect_each_once(idem::test::count_runs(idem::test::per_worker_files(
                                   dir_, "effects", idem::test::kPlanWorkers)),
                               plan.items);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.table("processed_log") +
                  " WHERE consumer = 'inventory'"),
            idem::test::kPlanItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.table("claims") + " WHERE done_at IS NULL"), 0)
      << "every claim completed";
}

TEST_F(PostgresMultiProcess, TransactionalModeRunsEverySideEffectOnce) {
  const idem::test::DeliveryPlan plan = make_plan("");
  idem::test::expect_consumer_totals(run_workers(dir_, plan,
                                                 {"consume", "--schema", schema_.name(), "--mode",
                                                  "transactional", "--consumer", "inventory"},
                                                 "--events", "transactional"),
                                     plan);
  const std::string side = schema_.table("side_effects");
  const std::string log = schema_.table("processed_log");
  EXPECT_EQ(count("SELECT count(*) FROM " + side), idem::test::kPlanItems);
  EXPECT_EQ(count("SELECT count(DISTINCT event_id) FROM " + side), idem::test::kPlanItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + log + " WHERE consumer = 'inventory'"),
            idem::test::kPlanItems);
  EXPECT_EQ(count("SELECT count(*) FROM " + log + " p LEFT JOIN " + side +
                  " s ON s.event_id = p.event_id WHERE s.event_id IS NULL"),
            0)
      << "every marker has its side effect";
  EXPECT_GE(count("SELECT count(DISTINCT worker) FROM " + side), 2)
      << "the work was spread over the processes";
}

TEST_F(PostgresMultiProcess, KeyedOperationsExecuteOnceAcrossProcesses) {
  const idem::test::DeliveryPlan plan = make_plan("op:");
  const auto total = idem::test::sum_counts(
      run_workers(dir_, plan, {"operations", "--schema", schema_.name()}, "--keys", "operations"),
      {"executed", "replayed", "joined", "waits", "notified"});
  EXPECT_EQ(total.at("executed"), idem::test::kPlanItems);
  EXPECT_EQ(total.at("executed") + total.at("replayed"), static_cast<long>(plan.deliveries));
  std::printf("calls=%zu executed=%ld replayed=%ld waits=%ld woken_by_notify=%ld\n",
              plan.deliveries, total.at("executed"), total.at("replayed"), total.at("waits"),
              total.at("notified"));

  const std::string executions = schema_.table("executions");
  EXPECT_EQ(count("SELECT count(*) FROM " + executions), idem::test::kPlanItems)
      << "each operation ran once";
  EXPECT_EQ(count("SELECT count(DISTINCT key) FROM " + executions), idem::test::kPlanItems);
  // Every caller, in every process, got the value of the one execution.
  std::map<std::string, std::string> value_of;
  int mismatches = 0;
  for (const auto& list :
       idem::test::per_worker_files(dir_, "operations-list", idem::test::kPlanWorkers)) {
    std::ifstream in(list + ".out");
    for (std::string key, value, status; in >> key >> value >> status;) {
      const auto [it, inserted] = value_of.emplace(key, value);
      if (!inserted && it->second != value && ++mismatches <= 5) {
        ADD_FAILURE() << key << ": " << it->second << " vs " << value;
      }
    }
  }
  EXPECT_EQ(value_of.size(), static_cast<std::size_t>(idem::test::kPlanItems));
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(
      count("SELECT count(*) FROM " + schema_.table("records") + " WHERE state <> 'completed'"), 0);
}

}  // namespace
