// Leases of the SQLite idempotency store across processes (idem_test_sqlite_store_worker):
//
//   * an owner SIGKILLed mid-operation: its claim blocks the key until its lease ends, then
//     another process takes it over and the operation completes once; the dead owner's token is
//     refused afterwards;
//   * a stalled owner (a bare store-API claim left idle past its lease) comes back after another
//     process took over: its complete/release/renew with the old token change nothing;
//   * a live owner running longer than its lease keeps the key (the coordinator's heartbeat
//     renews it): a caller waiting several leases for it gives up with AlreadyInProgress;
//   * a caller in another process is rejected at once (reject policy) or waits and then replays
//     the owner's result (wait policy).
// Leases are real time here (the processes share nothing but the file), so the tests wait for
// leases of a few hundred milliseconds to pass — by waiting for the worker that waits for them,
// never by sleeping.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "worker/child_process.hpp"

namespace {

// The key the worker's operation ("store_worker") keeps in the store for `key`.
std::string stored(const std::string& key) {
  return idem::scoped_idempotency_key("store_worker", key);
}

using idem::test::ChildProcess;
using namespace std::chrono_literals;

using idem::test::TempDir;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

bool exited_cleanly(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

class SqliteStoreLeases : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.file("store.db");
    effects_ = dir_.file("effects.txt");
    store_ = std::make_unique<idem::sqlite::SqliteIdempotencyStore>(db_);
  }

  // A worker making one call for `key`; `extra` are more options.
  std::unique_ptr<ChildProcess> call(const std::string& key, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        IDEM_SQLITE_STORE_WORKER, "call", "--db", db_, "--key", key, "--effects", effects_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<ChildProcess>(argv);
  }

  // The pids that executed `key`, in order, from the effects file.
  std::vector<std::string> executions(const std::string& key) {
    std::vector<std::string> pids;
    std::ifstream in(effects_);
    for (std::string k, pid; in >> k >> pid;) {
      if (k == key) pids.push_back(pid);
    }
    return pids;
  }

  TempDir dir_;
  std::string db_;
  std::string effects_;
  std::unique_ptr<idem::sqlite::SqliteIdempotencyStore> store_;  // the test's own view of the file
};

TEST_F(SqliteStoreLeases, OwnerKilledMidOperationIsTakenOverAfterItsLease) {
  auto owner = call("pay:1", {"--lease-ms", "400", "--hold"});
  ASSERT_EQ(owner->read_line(), "ready");
  const auto claimed = store_->lookup(stored("pay:1"));
  ASSERT_TRUE(claimed);
  ASSERT_EQ(claimed->state, idem::IdempotencyRecord::State::in_progress);
  const std::uint64_t dead_token = claimed->token;
  owner->kill(SIGKILL);
  const int owner_status = owner->wait();
  EXPECT_TRUE(WIFSIGNALED(owner_status) && WTERMSIG(owner_status) == SIGKILL);

  // The dead owner's claim stays until its lease ends; the next caller waits it out, then takes
  // the key over and completes it.
  auto next = call("pay:1", {"--lease-ms", "400", "--policy", "wait", "--max-wait-ms", "20000"});
  std::string outcome = next->read_line();
  if (outcome == "waiting") outcome = next->read_line();
  EXPECT_TRUE(exited_cleanly(next->wait()));
  const std::string value = "value:pay:1:" + std::to_string(next->pid());
  EXPECT_EQ(outcome, "executed " + value + " took_over=1");

  // The operation ran in the killed owner (its effect happened before the kill: the documented
  // at-least-once window across a crash) and once more in the process that took over; it
  // completed once, with the second run's result.
  const auto runs = executions("pay:1");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], std::to_string(owner->pid()));
  EXPECT_EQ(runs[1], std::to_string(next->pid()));
  const auto record = store_->lookup(stored("pay:1"));
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
  EXPECT_GT(record->token, dead_token);
  EXPECT_EQ(record->value.bytes, value);

  // The dead owner's token is fenced off for good.
  idem::StoredValue stale;
  stale.bytes = "value:stale";
  EXPECT_FALSE(store_->complete(stored("pay:1"), dead_token, stale, idem::ExecutionReport{}, 1h));
  EXPECT_FALSE(store_->release(stored("pay:1"), dead_token));
  EXPECT_FALSE(store_->renew("pay:1", dead_token, 1h));
  EXPECT_EQ(store_->lookup(stored("pay:1"))->value.bytes, value);

  // Later callers replay; nothing runs a third time.
  auto later = call("pay:1");
  EXPECT_EQ(later->read_line(), "replayed " + value);
  EXPECT_TRUE(exited_cleanly(later->wait()));
  EXPECT_EQ(executions("pay:1").size(), 2u);
}

TEST_F(SqliteStoreLeases, AStalledOwnersLateCompleteIsRefused) {
  // A bare store-API owner: no heartbeat, so its lease lapses while it sits idle.
  ChildProcess stalled({IDEM_SQLITE_STORE_WORKER, "claim", "--db", db_, "--key", stored("pay:2"),
                        "--lease-ms", "300"});
  const std::string claimed = stalled.read_line();
  ASSERT_TRUE(starts_with(claimed, "token=")) << claimed;
  const std::uint64_t old_token = std::stoull(claimed.substr(6));

  auto next = call("pay:2", {"--policy", "wait", "--max-wait-ms", "20000"});
  std::string outcome = next->read_line();
  if (outcome == "waiting") outcome = next->read_line();
  const std::string value = "value:pay:2:" + std::to_string(next->pid());
  EXPECT_EQ(outcome, "executed " + value + " took_over=1");
  EXPECT_TRUE(exited_cleanly(next->wait()));

  // The stalled owner comes back and tries to finish with its old token.
  for (const std::string command : {"complete", "release", "renew"}) {
    stalled.write_stdin(command + "\n");
    EXPECT_EQ(stalled.read_line(), command + "=false");
  }
  stalled.write_stdin("exit\n");
  EXPECT_TRUE(exited_cleanly(stalled.wait()));

  const auto record = store_->lookup(stored("pay:2"));
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
  EXPECT_GT(record->token, old_token);
  EXPECT_EQ(record->value.bytes, value) << "the late owner changed the result";
}

TEST_F(SqliteStoreLeases, ALiveOwnerRunningLongerThanItsLeaseIsNotTakenOver) {
  // Lease 1 s, renewed every third of it by the owner's heartbeat; the other caller waits up to
  // three leases and must still find the key in progress.
  auto owner = call("pay:3", {"--lease-ms", "1000", "--hold"});
  ASSERT_EQ(owner->read_line(), "ready");
  const auto first = store_->lookup(stored("pay:3"));
  ASSERT_TRUE(first);

  auto other = call("pay:3", {"--lease-ms", "1000", "--policy", "wait", "--max-wait-ms", "3000"});
  EXPECT_EQ(other->read_line(), "waiting");
  const std::string outcome = other->read_line();
  EXPECT_TRUE(starts_with(outcome, "rejected ")) << outcome;
  EXPECT_NE(outcome.find("still in progress"), std::string::npos) << outcome;
  EXPECT_TRUE(exited_cleanly(other->wait()));

  const auto renewed = store_->lookup(stored("pay:3"));
  ASSERT_TRUE(renewed);
  EXPECT_EQ(renewed->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_EQ(renewed->token, first->token) << "the live owner's claim was taken over";
  EXPECT_GT(renewed->lease_until, first->lease_until + 2s) << "the lease was renewed";

  owner->write_stdin("finish\n");
  const std::string value = "value:pay:3:" + std::to_string(owner->pid());
  EXPECT_EQ(owner->read_line(), "executed " + value + " took_over=0");
  EXPECT_TRUE(exited_cleanly(owner->wait()));
  EXPECT_EQ(executions("pay:3").size(), 1u);
  EXPECT_EQ(store_->lookup(stored("pay:3"))->value.bytes, value);
}

TEST_F(SqliteStoreLeases, AnotherProcessIsRejectedOrWaitsAndReplays) {
  auto owner = call("pay:4", {"--hold"});
  ASSERT_EQ(owner->read_line(), "ready");

  auto rejected = call("pay:4", {"--policy", "reject"});
  const std::string refusal = rejected->read_line();
  EXPECT_TRUE(starts_with(refusal, "rejected ")) << refusal;
  EXPECT_NE(refusal.find("pay:4"), std::string::npos) << refusal;
  EXPECT_TRUE(exited_cleanly(rejected->wait()));

  auto waiter = call("pay:4", {"--policy", "wait", "--max-wait-ms", "20000"});
  ASSERT_EQ(waiter->read_line(), "waiting");  // polling the file for the owner's record
  owner->write_stdin("finish\n");
  const std::string value = "value:pay:4:" + std::to_string(owner->pid());
  EXPECT_EQ(owner->read_line(), "executed " + value + " took_over=0");
  EXPECT_EQ(waiter->read_line(), "replayed " + value);
  EXPECT_TRUE(exited_cleanly(owner->wait()));
  EXPECT_TRUE(exited_cleanly(waiter->wait()));
  EXPECT_EQ(executions("pay:4").size(), 1u) << "only the owner executed";
}

}  // namespace
