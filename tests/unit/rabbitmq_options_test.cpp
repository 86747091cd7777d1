// idem::rabbitmq without a broker: URL parsing and redaction, option validation, and what
// happens when nothing listens (errors, bounded reconnects with backoff on the injected clock).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "idem/error.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using idem::rabbitmq::ConnectionOptions;
using idem::rabbitmq::Consumer;
using idem::rabbitmq::ConsumerOptions;

std::string config_error_of(std::string_view url) {
  try {
    ConnectionOptions::from_url(url);
  } catch (const idem::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for " << url;
  return {};
}

TEST(RabbitMqOptionsTest, ParsesEveryPartOfAUrl) {
  const auto options =
      ConnectionOptions::from_url("amqp://alice:s%40cret@broker.local:5673/orders");
  EXPECT_EQ(options.host, "broker.local");
  EXPECT_EQ(options.port, 5673);
  EXPECT_EQ(options.user, "alice");
  EXPECT_EQ(options.password, "s@cret");
  EXPECT_EQ(options.vhost, "orders");
  EXPECT_EQ(options.describe(), "amqp://alice@broker.local:5673/orders");
  EXPECT_EQ(options.describe().find("cret"), std::string::npos);
}

TEST(RabbitMqOptionsTest, DefaultsForMissingParts) {
  const auto options = ConnectionOptions::from_url("amqp://localhost");
  EXPECT_EQ(options.host, "localhost");
  EXPECT_EQ(options.port, 5672);
  EXPECT_EQ(options.user, "guest");
  EXPECT_EQ(options.password, "guest");
  EXPECT_EQ(options.vhost, "/");
  EXPECT_EQ(ConnectionOptions::from_url("amqp://guest:guest@127.0.0.1:5672/").vhost, "/");
  EXPECT_EQ(ConnectionOptions::from_url("AMQP://h:1/%2f").vhost, "/");
}

TEST(RabbitMqOptionsTest, BadUrlsNameThePartAndHideThePassword) {
  EXPECT_NE(config_error_of("http://h/").find("scheme"), std::string::npos);
  EXPECT_NE(config_error_of("").find("scheme"), std::string::npos);
  EXPECT_NE(config_error_of("amqps://h/?bogus=1").find("bogus"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h/?cacertfile=x").find("amqps://"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://").find("host"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://u:p@:5672/").find("host"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h:abc/").find("port 'abc'"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h:0/").find("1..65535"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h:70000/").find("1..65535"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h:/").find("port is empty"), std::string::npos);
  EXPECT_NE(config_error_of("amqp://h/%zz").find("malformed"), std::string::npos);
  EXPECT_NE(config_error_of(std::string("amqp://h\0/", 10)).find("NUL"), std::string::npos);
  const std::string message = config_error_of("amqp://bob:hunter2@h:notaport/");
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
  EXPECT_NE(message.find("bob:***@"), std::string::npos) << message;
}

TEST(RabbitMqOptionsTest, RedactsOnlyThePassword) {
  using idem::rabbitmq::redact_amqp_url;
  EXPECT_EQ(redact_amqp_url("amqp://guest:guest@h:5672/"), "amqp://guest:***@h:5672/");
  EXPECT_EQ(redact_amqp_url("amqp://a:b:c@h/v"), "amqp://a:***@h/v");
  EXPECT_EQ(redact_amqp_url("amqp://user@h/"), "amqp://user@h/");
  EXPECT_EQ(redact_amqp_url("amqp://h/"), "amqp://h/");
  EXPECT_EQ(redact_amqp_url("garbage"), "garbage");
}

ConsumerOptions valid_consumer() {
  ConsumerOptions options;
  options.consumer_name = "orders";
  return options;
}

template <class F>
std::string config_error(F&& make) {
  try {
    make();
  } catch (const idem::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

TEST(RabbitMqOptionsTest, ConsumerOptionsAreValidated) {
  const ConnectionOptions connection;
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.prefetch = 0;
              Consumer c(connection, o);
            }).find("prefetch 0"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.prefetch = -3;
              Consumer c(connection, o);
            }).find("prefetch -3"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.prefetch = 70000;
              Consumer c(connection, o);
            }).find("1..65535"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.batch_size = 0;
              Consumer c(connection, o);
            }).find("batch_size 0"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.batch_size = 65536;
              Consumer c(connection, o);
            }).find("1..65535"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.consumer_name = "";
              Consumer c(connection, o);
            }).find("consumer_name"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.consumer_name = "bad\nname";
              Consumer c(connection, o);
            }).find("consumer_name"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.max_deliveries = 0;
              Consumer c(connection, o);
            }).find("max_deliveries"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.poll_interval = idem::Millis(0);
              Consumer c(connection, o);
            }).find("poll_interval"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.exchange = "";
              Consumer c(connection, o);
            }).find("exchange is empty"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.queue_name = std::string(256, 'q');
              Consumer c(connection, o);
            }).find("255"),
            std::string::npos);
  EXPECT_NE(config_error([&] {
              auto o = valid_consumer();
              o.dead_letter_queue = "idem.orders";
              Consumer c(connection, o);
            }).find("the same"),
            std::string::npos);
  Consumer fine(connection, valid_consumer());  // does not connect
  EXPECT_EQ(fine.queue_name(), "idem.orders");
  EXPECT_EQ(fine.dead_letter_queue(), "idem.orders.dlq");
}

TEST(RabbitMqOptionsTest, ConnectionOptionsAreValidated) {
  const auto with = [](auto change) {
    ConnectionOptions options;
    change(options);
    return config_error([&] { Consumer c(options, valid_consumer()); });
  };
  EXPECT_NE(with([](ConnectionOptions& o) { o.port = 0; }).find("port 0"), std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) { o.host = ""; }).find("host"), std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) { o.vhost = ""; }).find("vhost"), std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) {
              o.connect_timeout = idem::Millis(0);
            }).find("connect_timeout"),
            std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) { o.heartbeat = idem::Millis(-1); }).find("heartbeat"),
            std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) {
              o.initial_backoff = std::chrono::seconds(2);
              o.max_backoff = std::chrono::seconds(1);
            }).find("max_backoff"),
            std::string::npos);
  EXPECT_NE(with([](ConnectionOptions& o) {
              o.max_reconnect_attempts = -1;
            }).find("max_reconnect_attempts"),
            std::string::npos);
  EXPECT_NE(config_error([] {
              idem::rabbitmq::PublisherOptions o;
              o.exchange = "";
              idem::rabbitmq::Publisher p(ConnectionOptions{}, o);
            }).find("exchange is empty"),
            std::string::npos);
}

// Port 1 on loopback: nothing listens, connects are refused at once.
ConnectionOptions nobody_listens(std::shared_ptr<idem::Clock> clock = nullptr) {
  ConnectionOptions options;
  options.port = 1;
  options.clock = std::move(clock);
  return options;
}

TEST(RabbitMqOptionsTest, NoBrokerIsARetryableBrokerError) {
  try {
    idem::rabbitmq::Publisher publisher(nobody_listens());
    FAIL() << "connected to port 1";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt());
    EXPECT_NE(std::string(e.what()).find("connect to amqp://guest@127.0.0.1:1/"), std::string::npos)
        << e.what();
  }
  auto handler = idem::make_idempotent_handler(
      "orders", std::make_shared<idem::InMemoryIdempotencyRecorder>(), [](const std::string&) {});
  Consumer consumer(nobody_listens(), valid_consumer());
  EXPECT_THROW(consumer.poll_once(*handler, idem::Millis(10)), idem::rabbitmq::BrokerError);
  EXPECT_THROW(consumer.connect(), idem::rabbitmq::BrokerError);
}

TEST(RabbitMqOptionsTest, RunGivesUpAfterMaxReconnectAttemptsWithDoublingBackoff) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto options = nobody_listens(clock);
  options.initial_backoff = std::chrono::milliseconds(100);
  options.max_backoff = std::chrono::milliseconds(250);
  options.max_reconnect_attempts = 4;
  auto consumer_options = valid_consumer();
  consumer_options.poll_interval = std::chrono::seconds(1);  // backoff waits in one slice
  auto handler = idem::make_idempotent_handler(
      "orders", std::make_shared<idem::InMemoryIdempotencyRecorder>(), [](const std::string&) {});
  Consumer consumer(options, consumer_options);
  try {
    consumer.run(*handler);
    FAIL() << "run returned";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("gave up after 4 attempts"), std::string::npos)
        << e.what();
  }
  const std::vector<std::chrono::nanoseconds> expected = {std::chrono::milliseconds(100),
                                                          std::chrono::milliseconds(200),
                                                          std::chrono::milliseconds(250)};
  EXPECT_EQ(clock->sleeps(), expected);
}

TEST(RabbitMqOptionsTest, StopBeforeRunEndsItWithoutConnecting) {
  auto handler = idem::make_idempotent_handler(
      "orders", std::make_shared<idem::InMemoryIdempotencyRecorder>(), [](const std::string&) {});
  Consumer consumer(nobody_listens(), valid_consumer());
  consumer.stop();
  EXPECT_FALSE(consumer.run_until(*handler, [] { return false; }));
  EXPECT_EQ(consumer.stats().delivered, 0u);
}

}  // namespace
