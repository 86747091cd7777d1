// idem's RabbitMQ transport under the least rights of docs/security.md: a user with
// permissions on its own vhost limited to the consumer's queue, its dead-letter queue and the
// events exchange (configure), publishing to the exchange and the default exchange (write) and
// binding and consuming (read). A consumer and a publisher work under it; a queue outside the
// pattern and another vhost are refused with a classified, non-retryable BrokerError (403
// ACCESS_REFUSED / 530 NOT_ALLOWED), never a crash. (Each case costs a few seconds of
// rabbitmqctl calls.)
// Needs IDEM_TEST_AMQP_URL and IDEM_TEST_RABBITMQCTL (scripts/servers.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;

std::string regex_quote(const std::string& name) {
  return std::regex_replace(name, std::regex(R"([.^$|()\[\]{}*+?\\-])"), R"(\$&)");
}

class RabbitMqPrivilege : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::rabbitmqctl().empty()) GTEST_SKIP() << "IDEM_TEST_RABBITMQCTL is not set";
    user_ = "idem_app_" + std::to_string(::getpid());
    vhost_ = "idem_vhost_" + std::to_string(::getpid());
    consumer_ = topology_.consumer("priv");
    const std::string e = regex_quote(topology_.exchange());
    const std::string q = regex_quote("idem." + consumer_);
    // docs/security.md, "RabbitMQ": configure, write, read.
    const std::string configure = "^(" + e + "|" + q + "|" + q + "\\.dlq)$";
    const std::string write = "^(" + e + "|" + q + "|amq\\.default)$";
    const std::string read = "^(" + e + "|" + q + ")$";
    ASSERT_TRUE(idem::test::broker_command("add_vhost " + vhost_));
    ASSERT_TRUE(idem::test::broker_command("add_user " + user_ + " app-password"));
    ASSERT_TRUE(idem::test::broker_command("set_permissions -p " + vhost_ + " " + user_ + " '" +
                                           configure + "' '" + write + "' '" + read + "'"));
  }
  void TearDown() override {
    if (user_.empty()) return;
    idem::test::broker_command("delete_user " + user_);
    idem::test::broker_command("delete_vhost " + vhost_);
  }

  idem::rabbitmq::ConnectionOptions as_app() const {
    idem::rabbitmq::ConnectionOptions o = idem::test::amqp_test_options();
    o.user = user_;
    o.password = "app-password";
    o.vhost = vhost_;
    o.max_reconnect_attempts = 1;
    return o;
  }

  idem::test::TestTopology topology_;
  std::string user_;
  std::string vhost_;
  std::string consumer_;
};

TEST_F(RabbitMqPrivilege, ConsumerAndPublisherWorkUnderTheDocumentedPermissions) {
  idem::rabbitmq::ConsumerOptions co = topology_.consumer_options("priv");
  co.max_deliveries = 1;
  idem::rabbitmq::Consumer consumer(as_app(), co);
  consumer.connect();
  idem::rabbitmq::Publisher publisher(as_app(), topology_.publisher_options());
  std::vector<std::string> seen;
  idem::test::FnHandler handler(consumer_, [&](const idem::Event& event, idem::BusProxy&) {
    seen.push_back(event.id);
    if (event.type == "priv.fail") throw std::runtime_error("to the dead-letter queue");
    return idem::HandleResult::processed;
  });
  const idem::Event ok = idem::Event::make("priv.ok", "1");
  const idem::Event failing = idem::Event::make("priv.fail", "2");
  publisher.publish(ok);
  publisher.publish(failing);
  ASSERT_TRUE(consumer.run_until(handler, [&] { return consumer.stats().dead_lettered >= 1; }));
  EXPECT_NE(std::find(seen.begin(), seen.end(), ok.id), seen.end());
  EXPECT_EQ(consumer.stats().dead_lettered, 1u);  // published through amq.default
}

TEST_F(RabbitMqPrivilege, AQueueOutsideThePatternIsRefused) {
  idem::rabbitmq::ConsumerOptions co = topology_.consumer_options("other");  // not "priv"
  idem::rabbitmq::Consumer consumer(as_app(), co);
  try {
    consumer.connect();
    FAIL() << "declared a queue outside the user's permissions";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("403"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("app-password"), std::string::npos) << e.what();
  }
}

TEST_F(RabbitMqPrivilege, AnotherVhostIsRefused) {
  idem::rabbitmq::ConnectionOptions o = as_app();
  o.vhost = "/";  // the user has no permissions there
  try {
    idem::rabbitmq::Publisher publisher(o, topology_.publisher_options());
    publisher.publish(idem::Event::make("priv.ok", "x"));
    FAIL() << "logged in to a vhost without permissions";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("530"), std::string::npos) << e.what();
  }
}

}  // namespace
