// The outbox through its crash points, with real processes and a real broker (RabbitMQ through
// scripts/servers.sh; the outbox in a SQLite file):
//   * the handler process is killed (SIGKILL) after publishing its follow-ups, before COMMIT:
//     neither marker nor rows exist; the redelivery commits them once, with the same ids;
//   * the relay process is killed after the broker confirmed, before the delete: `idem relay`
//     publishes the rows again, and the downstream consumer drops every repeat by id;
//   * the broker is stopped and started under a running `idem relay`: rows committed meanwhile
//     wait in the outbox and go out after the restart;
//   * `idem relay --once` on a PostgreSQL outbox publishes its rows once.
// In every case each follow-up reaches the downstream consumer and takes effect exactly once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../integration/rabbitmq_test_env.hpp"
#include "../outbox_case.hpp"
#include "../temp_dir.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "worker/child_process.hpp"
#if __has_include("idem/postgres/postgres_outbox.hpp")
#define IDEM_OUTBOX_TEST_POSTGRES 1
#include "../postgres_test_support.hpp"
#include "idem/postgres/postgres_outbox.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#endif

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using idem::test::ChildProcess;
using idem::test::ForkedChild;

// The downstream consumer: an idempotent handler counting effects per event id.
struct Downstream {
  std::shared_ptr<idem::InMemoryIdempotencyRecorder> recorder =
      std::make_shared<idem::InMemoryIdempotencyRecorder>();
  std::mutex mutex;
  std::map<std::string, int> effects;  // event id → times the side effect ran
  std::shared_ptr<idem::EventHandler> handler;

  explicit Downstream(const std::string& consumer) {
    handler = idem::make_idempotent_handler(
        consumer, recorder,
        [this](const std::string&, idem::BusProxy&, const idem::Event& event) {
          std::lock_guard lock(mutex);
          ++effects[event.id];
        },
        idem::HandlerOptions{idem::HandlerMode::check_then_mark});
  }
  std::size_t distinct() {
    std::lock_guard lock(mutex);
    return effects.size();
  }
  int max_effects() {
    std::lock_guard lock(mutex);
    int most = 0;
    for (const auto& [id, n] : effects)
      most = std::max(most, n);
    return most;
  }
};

class RabbitMqOutbox : public ::testing::Test {
 protected:
  void SetUp() override {
    consumer_options = topology.consumer_options("shipping");
    consumer_options.batch_size = 1;
    // The queue exists before anything is published (a topic exchange drops unrouted events).
    idem::rabbitmq::Consumer(idem::test::amqp_test_options(), consumer_options).connect();
  }

  idem::test::OutboxFixture fixture() {
    return {std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(db),
            std::make_shared<idem::sqlite::SqliteOutbox>(db)};
  }

  // `idem relay` on the SQLite file and the test broker, with `extra` arguments.
  std::vector<std::string> relay_command(std::vector<std::string> extra) const {
    std::vector<std::string> argv = {IDEM_CLI,     "relay",
                                     "--store",    "sqlite:" + db,
                                     "--broker",   idem::test::amqp_url(),
                                     "--exchange", topology.exchange()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Runs `idem relay --once`; returns its output.
  std::string relay_once() {
    ChildProcess relay(relay_command({"--once"}));
    const std::string out = relay.read_all();
    const int status = relay.wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    return out;
  }

  // Consumes until `distinct` follow-ups took effect and the queue is drained, bounded.
  void consume(Downstream& downstream, std::size_t distinct) {
    idem::rabbitmq::Consumer consumer(idem::test::amqp_test_options(), consumer_options);
    for (int i = 0; i < 600; ++i) {
      const bool got = consumer.poll_once(*downstream.handler, std::chrono::milliseconds(100));
      if (!got && downstream.distinct() >= distinct) break;
    }
  }

  idem::test::TempDir dir;
  std::string db = dir.file("billing.db");
  idem::test::TestTopology topology;
  idem::rabbitmq::ConsumerOptions consumer_options;
};

TEST_F(RabbitMqOutbox, HandlerKilledBeforeCommitPublishesOnceAfterRedelivery) {
  {
    auto f = fixture();  // creates the tables before the child uses the file
  }
  ForkedChild handler_process([&] {
    auto f = fixture();
    auto handler = idem::test::charging_handler(f, "billing", 2, [] {
      ::raise(SIGKILL);  // after both publishes, before COMMIT
      return false;
    });
    idem::CollectingBusProxy proxy("billing");
    (void)(*handler)(idem::test::incoming("order-1"), proxy);
    return std::string("the handler returned: it was not killed");
  });
  const ForkedChild::End killed = handler_process.wait();
  ASSERT_TRUE(killed.killed_by(SIGKILL)) << killed.problem();

  auto f = fixture();
  EXPECT_FALSE(f.recorder->is_processed("billing", "order-1"));
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  idem::CollectingBusProxy proxy("billing");
  ASSERT_EQ(
      (*idem::test::charging_handler(f, "billing", 2))(idem::test::incoming("order-1"), proxy),
      idem::HandleResult::processed);
  EXPECT_EQ(f.outbox->stats().depth, 2u);

  const std::string out = relay_once();
  EXPECT_NE(out.find("2 published"), std::string::npos) << out;
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  Downstream downstream(topology.consumer("shipping"));
  consume(downstream, 2);
  EXPECT_EQ(downstream.distinct(), 2u);
  EXPECT_EQ(downstream.max_effects(), 1);
  std::lock_guard lock(downstream.mutex);
  EXPECT_EQ(downstream.effects.count(idem::follow_up_id("billing", "order-1", 0)), 1u);
  EXPECT_EQ(downstream.effects.count("order-1-1"), 1u);
}

TEST_F(RabbitMqOutbox, RelayKilledAfterConfirmBeforeDeleteRepublishesAndDownstreamDedups) {
  constexpr int kEvents = 20;
  {
    auto f = fixture();
    idem::CollectingBusProxy proxy("billing");
    auto handler = idem::test::charging_handler(f, "billing", 1);
    for (int i = 0; i < kEvents; ++i) {
      ASSERT_EQ((*handler)(idem::test::incoming("o" + std::to_string(i)), proxy),
                idem::HandleResult::processed);
    }
  }
  ForkedChild relay_process([&] {
    // A relay process whose publisher is killed once the broker confirmed the whole batch.
    class DyingPublisher : public idem::OutboxPublisher {
     public:
      explicit DyingPublisher(std::shared_ptr<idem::rabbitmq::Publisher> p)
          : inner_(std::move(p)) {}
      std::vector<idem::PublishVerdict> publish(std::span<const idem::OutboxRow> rows) override {
        auto verdicts = inner_.publish(rows);
        ::raise(SIGKILL);  // confirmed, not yet deleted
        return verdicts;
      }

     private:
      idem::rabbitmq::RabbitMqOutboxPublisher inner_;
    };
    auto outbox = std::make_shared<idem::sqlite::SqliteOutbox>(db);
    auto publisher = std::make_shared<idem::rabbitmq::Publisher>(idem::test::amqp_test_options(),
                                                                 topology.publisher_options());
    idem::OutboxRelay relay(outbox, std::make_shared<DyingPublisher>(publisher));
    relay.drain();
    return std::string("the relay drained: it was not killed");
  });
  const ForkedChild::End killed = relay_process.wait();
  ASSERT_TRUE(killed.killed_by(SIGKILL)) << killed.problem();
  auto f = fixture();
  EXPECT_EQ(f.outbox->stats().depth, static_cast<std::uint64_t>(kEvents));  // nothing deleted

  const std::string out = relay_once();
  EXPECT_NE(out.find(std::to_string(kEvents) + " published"), std::string::npos) << out;
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  Downstream downstream(topology.consumer("shipping"));
  consume(downstream, kEvents);
  EXPECT_EQ(downstream.distinct(), static_cast<std::size_t>(kEvents));
  EXPECT_EQ(downstream.max_effects(), 1);  // each published twice, applied once
}

TEST_F(RabbitMqOutbox, BrokerRestartUnderTheRelayLosesNothing) {
  if (idem::test::rabbitmqctl().empty()) GTEST_SKIP() << "IDEM_TEST_RABBITMQCTL is not set";
  auto f = fixture();
  idem::CollectingBusProxy proxy("billing");
  auto handler = idem::test::charging_handler(f, "billing", 1);
  const auto handle = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      ASSERT_EQ((*handler)(idem::test::incoming("r" + std::to_string(i)), proxy),
                idem::HandleResult::processed);
    }
  };
  const auto wait_empty = [&] {
    for (int i = 0; i < 600 && f.outbox->stats().depth > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return f.outbox->stats().depth == 0;
  };

  ChildProcess relay(relay_command({"--poll-ms", "100"}));
  handle(0, 10);
  ASSERT_TRUE(wait_empty());

  idem::test::BrokerGuard guard;
  ASSERT_TRUE(idem::test::broker_command("stop_app"));
  guard.stopped = true;
  handle(10, 20);  // committed while the broker is down: they wait in the outbox
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(f.outbox->stats().depth, 10u);
  ASSERT_TRUE(idem::test::broker_command("start_app"));
  guard.stopped = false;
  handle(20, 30);
  ASSERT_TRUE(wait_empty());
  EXPECT_EQ(f.outbox->stats().parked, 0u);  // a broker outage is not a refusal

  relay.kill(SIGTERM);
  const std::string out = relay.read_all();
  const int status = relay.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;

  Downstream downstream(topology.consumer("shipping"));
  consume(downstream, 30);
  EXPECT_EQ(downstream.distinct(), 30u);
  EXPECT_EQ(downstream.max_effects(), 1);
}

#if IDEM_OUTBOX_TEST_POSTGRES
// The same relay command on a PostgreSQL outbox (built with the PostgreSQL backend only).
TEST_F(RabbitMqOutbox, IdemRelayPublishesPostgresRowsOnce) {
  if (!idem::test::pg::server_url()) GTEST_SKIP() << "IDEM_TEST_POSTGRES_URL is not set";
  idem::test::pg::TempSchema schema;
  auto pool = std::make_shared<idem::postgres::ConnectionPool>(schema.options());
  idem::test::OutboxFixture f{std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(pool),
                              std::make_shared<idem::postgres::PostgresOutbox>(pool)};
  idem::CollectingBusProxy proxy("billing");
  auto handler = idem::test::charging_handler(f, "billing", 2);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ((*handler)(idem::test::incoming("pg" + std::to_string(i)), proxy),
              idem::HandleResult::processed);
  }
  const std::string url =
      *idem::test::pg::server_url() +
      (idem::test::pg::server_url()->find('?') == std::string::npos ? "?" : "&") +
      "schema=" + schema.name();
  ChildProcess relay({IDEM_CLI, "relay", "--once", "--store", url, "--broker",
                      idem::test::amqp_url(), "--exchange", topology.exchange()});
  const std::string out = relay.read_all();
  const int status = relay.wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("10 published"), std::string::npos) << out;
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  Downstream downstream(topology.consumer("shipping"));
  consume(downstream, 10);
  EXPECT_EQ(downstream.distinct(), 10u);
  EXPECT_EQ(downstream.max_effects(), 1);
}

#endif

}  // namespace
