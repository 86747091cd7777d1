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

#include <string>
#include <vector>

#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "worker_process.hpp"

namespace {

using idem::test::TempDir;

// Runs the plan with idem::test::kPlanWorkers processes in `mode` (exclusive mode: each appends the
// ids it handled to its own file of `effects`); returns their summaries.
std::vector<std::string> run_workers(const TempDir& dir, const std::string& db,
                                     const std::string& mode, const idem::test::DeliveryPlan& plan,
                                     const std::vector<std::string>& effects) {
  const auto events = idem::test::per_worker_files(dir, mode + "-events", idem::test::kPlanWorkers);
  std::vector<std::vector<std::string>> argvs;
  for (std::size_t w = 0; w < events.size(); ++w) {
    std::vector<std::string> argv = {
        IDEM_TEST_WORKER, "consume",
        "--db",           db,
        "--mode",         mode,
        "--events",       idem::test::write_lines(events[w], plan.lists[w]),
        "--consumer",     "inventory",
        "--worker",       "w" + std::to_string(w),
        "--wait-go"};
    if (mode == "exclusive") argv.insert(argv.end(), {"--effects", effects[w]});
    argvs.push_back(std::move(argv));
  }
  return idem::test::run_together(argvs);
}

class SqliteMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    plan_ = idem::test::make_delivery_plan(20261130);
    ASSERT_GE(static_cast<double>(plan_.duplicated), 0.30 * idem::test::kPlanItems);
    db_ = dir_.file("shared.db");
    // Created once up front, as a deployment would; the workers open the existing file.
    idem::sqlite::SqliteIdempotencyRecorder create(db_);
    idem::test::sqlite_exec(
        db_, "CREATE TABLE side_effects(event_id TEXT NOT NULL, worker TEXT NOT NULL)");
  }

  TempDir dir_;
  std::string db_;
  idem::test::DeliveryPlan plan_;
  std::vector<std::string> effects_ =
      idem::test::per_worker_files(dir_, "effects", idem::test::kPlanWorkers);
};

TEST_F(SqliteMultiProcess, ExclusiveModeRunsEverySideEffectOnce) {
  idem::test::expect_consumer_totals(run_workers(dir_, db_, "exclusive", plan_, effects_), plan_);
  idem::test::expect_each_once(idem::test::count_runs(effects_), plan_.items);
  EXPECT_EQ(idem::test::sqlite_query_int(
                db_, "SELECT count(*) FROM processed_log WHERE consumer = 'inventory'"),
            idem::test::kPlanItems);
  EXPECT_EQ(idem::test::sqlite_query_int(db_, "SELECT count(*) FROM idem_claims"), 0)
      << "every claim completed";
}

TEST_F(SqliteMultiProcess, TransactionalModeRunsEverySideEffectOnce) {
  idem::test::expect_consumer_totals(run_workers(dir_, db_, "transactional", plan_, effects_),
                                     plan_);

  EXPECT_EQ(idem::test::sqlite_query_int(db_, "SELECT count(*) FROM side_effects"),
            idem::test::kPlanItems);
  EXPECT_EQ(idem::test::sqlite_query_int(db_, "SELECT count(DISTINCT event_id) FROM side_effects"),
            idem::test::kPlanItems);
  EXPECT_EQ(idem::test::sqlite_query_int(
                db_, "SELECT count(*) FROM processed_log WHERE consumer = 'inventory'"),
            idem::test::kPlanItems);
  // Each side effect has its marker and each marker its side effect.
  EXPECT_EQ(idem::test::sqlite_query_int(
                db_,
                "SELECT count(*) FROM processed_log p LEFT JOIN side_effects s ON "
                "s.event_id = p.event_id WHERE s.event_id IS NULL"),
            0);
  // The work was spread over the processes, not done by one.
  EXPECT_GE(idem::test::sqlite_query_int(db_, "SELECT count(DISTINCT worker) FROM side_effects"),
            2);
}

}  // namespace
