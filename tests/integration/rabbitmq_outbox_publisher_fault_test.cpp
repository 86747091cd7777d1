// RabbitMqOutboxPublisher on a real broker: valid rows are confirmed in one batch, an event the
// Publisher would refuse (a type longer than an AMQP routing key) is refused with its reason and
// the rows around it still go; with the broker unreachable it throws and refuses nothing. The
// last case stops the shared broker, so this is a *_fault_test: nothing runs beside it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idem/outbox.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_test_env.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

idem::OutboxRow row(std::int64_t seq, std::string id, std::string type) {
  idem::OutboxRow r;
  r.seq = seq;
  r.consumer = "billing";
  r.event.id = std::move(id);
  r.event.type = std::move(type);
  r.event.payload = "p";
  return r;
}

TEST(RabbitMqOutboxPublisher, ConfirmsValidRowsAndRefusesInvalidOnes) {
  idem::test::TestTopology topology;
  auto consumer_options = topology.consumer_options("shipping");
  idem::rabbitmq::Consumer(idem::test::amqp_test_options(), consumer_options).connect();
  auto publisher = std::make_shared<idem::rabbitmq::Publisher>(idem::test::amqp_test_options(),
                                                               topology.publisher_options());
  idem::rabbitmq::RabbitMqOutboxPublisher outbox_publisher(publisher);
  const std::vector<idem::OutboxRow> rows = {row(1, "a1", "order.charged"),
                                             row(2, "a2", std::string(256, 't')),
                                             row(3, "a3", "order.charged")};
  const auto verdicts = outbox_publisher.publish(rows);
  ASSERT_EQ(verdicts.size(), 3u);
  EXPECT_TRUE(verdicts[0].confirmed);
  EXPECT_FALSE(verdicts[1].confirmed);
  EXPECT_NE(verdicts[1].refusal.find("255"), std::string::npos) << verdicts[1].refusal;
  EXPECT_TRUE(verdicts[2].confirmed);
  // Both confirmed rows are stored in the bound queue.
  std::size_t depth = 0;
  for (int i = 0; i < 100 && depth < 2; ++i) {
    depth = idem::rabbitmq::queue_depth(idem::test::amqp_test_options(),
                                        "idem." + consumer_options.consumer_name);
    if (depth < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(depth, 2u);
}

TEST(RabbitMqOutboxPublisher, AnUnreachableBrokerThrowsInsteadOfRefusing) {
  idem::test::TestTopology topology;
  auto publisher = std::make_shared<idem::rabbitmq::Publisher>(idem::test::amqp_test_options(),
                                                               topology.publisher_options());
  idem::rabbitmq::RabbitMqOutboxPublisher outbox_publisher(publisher);
  const std::vector<idem::OutboxRow> rows = {row(1, "b1", "order.charged")};
  ASSERT_TRUE(outbox_publisher.publish(rows)[0].confirmed);
  if (idem::test::rabbitmqctl().empty()) GTEST_SKIP() << "IDEM_TEST_RABBITMQCTL is not set";
  idem::test::BrokerGuard guard;
  ASSERT_TRUE(idem::test::broker_command("stop_app"));
  guard.stopped = true;
  EXPECT_THROW(outbox_publisher.publish(rows), idem::rabbitmq::BrokerError);
  ASSERT_TRUE(idem::test::broker_command("start_app"));
  guard.stopped = false;
}

TEST(RabbitMqOutboxPublisher, NeedsAPublisher) {
  EXPECT_THROW(idem::rabbitmq::RabbitMqOutboxPublisher(nullptr), idem::InvalidArgument);
}

}  // namespace
