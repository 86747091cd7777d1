// A consumer process behind RabbitMQ killed with SIGKILL at a crash point, then a fresh process
// draining the queue (tests/process/worker/rabbitmq_worker.cpp):
//   * killed after its handler returned (marker committed) but before the ack: the broker
//     redelivers, the persistent recorder drops it — every side effect exactly once, in the
//     exclusive and check_then_mark modes;
//   * transactional mode killed after the side effect, before the commit: the ledger row and the
//     marker vanish together and are written once by the next process — never split;
//   * exclusive mode killed after the side effect, before the marker: that one event's side
//     effect runs twice — the at-least-once window docs/guarantees.md names;
//   * check_then_mark killed after a side effect, before its batch's mark: the side effects that
//     batch had run (at most batch_size, the one killed included) run twice — window W1 over a
//     batch; every other event once;
//   * a backlog of 10,000 events (plus 1,000 published duplicates) that accumulated while no
//     consumer ran is replayed by a restarted consumer: every event once, duplicates dropped.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../integration/rabbitmq_test_env.hpp"
#include "idem/event.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "worker/child_process.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

namespace fs = std::filesystem;
using idem::test::ChildProcess;

class RabbitMqCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "idem-amqp-crash-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    consumer_ = topology_.consumer("crash");
    // Declares the queue now, so everything published below is kept for the consumer.
    idem::rabbitmq::Consumer(idem::test::amqp_test_options(), topology_.consumer_options("crash"))
        .connect();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string db_path() const { return (dir_ / "idem.db").string(); }
  std::string recorder_url() const { return "sqlite://" + db_path() + "?durability=normal"; }
  std::string side_effects() const { return (dir_ / "side_effects.log").string(); }

  // Publishes `distinct` events, then `duplicates` copies of the first ones (same id, a later
  // seq). Returns every message's event id, by seq.
  std::vector<std::string> publish(std::size_t distinct, std::size_t duplicates) {
    idem::rabbitmq::Publisher publisher(idem::test::amqp_test_options(),
                                        topology_.publisher_options());
    // In batches of 500: one confirm wait (one quorum-queue fsync) per batch, not per event.
    constexpr std::size_t kBatch = 500;
    std::vector<std::string> ids;
    std::vector<idem::Event> batch;
    for (std::size_t i = 0; i < distinct + duplicates; ++i) {
      idem::Event event = idem::Event::make("order.paid", "{}");
      if (i >= distinct) event.id = ids[i - distinct];
      event.headers["seq"] = std::to_string(i);
      ids.push_back(event.id);
      batch.push_back(std::move(event));
      if (batch.size() == kBatch) {
        publisher.publish_batch(batch);
        batch.clear();
      }
    }
    publisher.publish_batch(batch);
    return ids;
  }

  void create_ledger() {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_path().c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE IF NOT EXISTS ledger(event_id TEXT NOT NULL)", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }

  // Side effects per event id: lines of the side-effect file, or ledger rows.
  std::map<std::string, int> side_effect_counts(bool ledger) {
    std::map<std::string, int> counts;
    if (ledger) {
      sqlite3* db = nullptr;
      EXPECT_EQ(sqlite3_open(db_path().c_str(), &db), SQLITE_OK);
      sqlite3_stmt* select = nullptr;
      sqlite3_prepare_v2(db, "SELECT event_id FROM ledger", -1, &select, nullptr);
      while (sqlite3_step(select) == SQLITE_ROW) {
        ++counts[reinterpret_cast<const char*>(sqlite3_column_text(select, 0))];
      }
      sqlite3_finalize(select);
      sqlite3_close(db);
    } else {
      std::ifstream in(side_effects());
      std::string line;
      while (std::getline(in, line))
        ++counts[line];
    }
    return counts;
  }

  ChildProcess worker(const std::string& mode, std::size_t expected, const std::string& point = "",
                      const std::string& seq = "") {
    std::vector<std::string> argv = {
        IDEM_RABBITMQ_WORKER, topology_.exchange(),    consumer_, recorder_url(), mode,
        side_effects(),       std::to_string(expected)};
    if (!point.empty()) argv.insert(argv.end(), {point, seq});
    return ChildProcess(argv);
  }

  // First a worker armed to die at `point` on message `seq` (it must die by SIGKILL), then a
  // clean one that drains the queue. Returns the clean worker's stats line.
  std::string crash_then_drain(const std::string& mode, std::size_t messages,
                               const std::string& point, const std::string& seq) {
    ChildProcess armed = worker(mode, messages, point, seq);
    armed.close_stdin();
    const int status = armed.wait();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the armed worker should have died at " << point << " (status " << status << ")";
    ChildProcess clean = worker(mode, messages);
    clean.close_stdin();
    const std::string stats = clean.read_all();
    const int clean_status = clean.wait();
    EXPECT_TRUE(WIFEXITED(clean_status) && WEXITSTATUS(clean_status) == 0) << stats;
    return stats;
  }

  idem::test::TestTopology topology_;
  fs::path dir_;
  std::string consumer_;
};

constexpr std::size_t kDistinct = 200;
constexpr std::size_t kDuplicates = 20;

TEST_F(RabbitMqCrash, KilledAfterCommitBeforeAckEverySideEffectOnce) {
  for (const char* mode : {"exclusive", "check_then_mark"}) {
    SCOPED_TRACE(mode);
    // A fresh queue and file per mode: the TestTopology's second consumer name.
    consumer_ = topology_.consumer(std::string("crash-") + mode);
    idem::rabbitmq::Consumer(idem::test::amqp_test_options(),
                             topology_.consumer_options(std::string("crash-") + mode))
        .connect();
    fs::remove(side_effects());
    fs::remove(side_effects() + ".settled");
    const auto ids = publish(kDistinct, kDuplicates);
    crash_then_drain(mode, ids.size(), "after_commit_before_ack", "100");
    const auto counts = side_effect_counts(/*ledger=*/false);
    EXPECT_EQ(counts.size(), kDistinct);
    for (const auto& [id, count] : counts)
      EXPECT_EQ(count, 1) << id;
  }
}

TEST_F(RabbitMqCrash, TransactionalInboxNeverSplitsMarkerAndSideEffect) {
  create_ledger();
  const auto ids = publish(kDistinct, kDuplicates);
  crash_then_drain("transactional", ids.size(), "after_side_effect", "100");
  const auto counts = side_effect_counts(/*ledger=*/true);
  EXPECT_EQ(counts.size(), kDistinct);
  for (const auto& [id, count] : counts)
    EXPECT_EQ(count, 1) << id;
  // The killed transaction's event (seq 100) was written once, by the second process.
  EXPECT_EQ(counts.at(ids[100]), 1);
}

TEST_F(RabbitMqCrash, ExclusiveKilledBeforeTheMarkerRunsThatOneSideEffectTwice) {
  const auto ids = publish(kDistinct, kDuplicates);
  crash_then_drain("exclusive", ids.size(), "after_side_effect", "100");
  const auto counts = side_effect_counts(/*ledger=*/false);
  EXPECT_EQ(counts.size(), kDistinct);
  for (const auto& [id, count] : counts) {
    // The documented window: the side effect ran, the process died before the marker, the claim's
    // lease ended, and the redelivery ran it again. Every other event: once.
    EXPECT_EQ(count, id == ids[100] ? 2 : 1) << id;
  }
}

TEST_F(RabbitMqCrash, CheckThenMarkKilledBeforeItsBatchMarkRunsThatBatchAgain) {
  const auto ids = publish(kDistinct, kDuplicates);
  crash_then_drain("check_then_mark", ids.size(), "after_side_effect", "100");
  const auto counts = side_effect_counts(/*ledger=*/false);
  EXPECT_EQ(counts.size(), kDistinct);
  EXPECT_EQ(counts.at(ids[100]), 2);
  // Only events of the killed batch may have run twice: it held seq 100 and at most
  // batch_size (64) deliveries before it.
  constexpr std::size_t kBatchSize = 64;
  std::size_t twice = 0;
  for (std::size_t seq = 0; seq < kDistinct; ++seq) {
    const int count = counts.at(ids[seq]);
    if (count == 2) {
      ++twice;
      EXPECT_TRUE(seq <= 100 && seq + kBatchSize > 100) << "seq " << seq << " ran twice";
    } else {
      EXPECT_EQ(count, 1) << "seq " << seq;
    }
  }
  EXPECT_LE(twice, kBatchSize);
}

TEST_F(RabbitMqCrash, ABacklogPublishedWhileNoConsumerRanIsReplayedOnce) {
  constexpr std::size_t kBacklog = 10'000;
  constexpr std::size_t kBacklogDuplicates = 1'000;
  const auto ids = publish(kBacklog, kBacklogDuplicates);
  EXPECT_EQ(idem::rabbitmq::queue_depth(idem::test::amqp_test_options(), "idem." + consumer_),
            kBacklog + kBacklogDuplicates);
  ChildProcess restarted = worker("check_then_mark", ids.size());
  restarted.close_stdin();
  const std::string stats = restarted.read_all();
  const int status = restarted.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << stats;
  const auto counts = side_effect_counts(/*ledger=*/false);
  EXPECT_EQ(counts.size(), kBacklog);
  for (const auto& [id, count] : counts)
    ASSERT_EQ(count, 1) << id;
  EXPECT_NE(stats.find("\"duplicates\":" + std::to_string(kBacklogDuplicates)), std::string::npos)
      << stats;
}

}  // namespace
