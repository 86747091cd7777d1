// Shared by idem's RabbitMQ tests: where the broker is, unique topology names per test, and a
// raw publisher for messages idem itself would never send (no message_id, a bad one).
//
// Tests find the broker in IDEM_TEST_AMQP_URL (scripts/servers.sh exports it). When it is
// missing every test of the binary is skipped with a message naming the variable — or, when
// IDEM_REQUIRE_SERVERS=1, the binary fails. A test binary opts in with
// IDEM_RABBITMQ_TEST_ENVIRONMENT() at namespace scope.
//
// TestTopology names an exchange "idemtest.<id>.events" and consumers "idemtest-<id>-<name>"
// (new_event_id() makes <id>), and deletes the exchange and every queue it named when destroyed.
#pragma once

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <gtest/gtest.h>

#include <stdio.h>  // popen, pclose

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../server_env.hpp"
#include "idem/event.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"

namespace idem::test {

inline std::string amqp_url() {
  return env("IDEM_TEST_AMQP_URL");
}

}  // namespace idem::test

#define IDEM_RABBITMQ_TEST_ENVIRONMENT()                                             \
  IDEM_SERVER_TEST_ENVIRONMENT(idem_rabbitmq_test_environment, "IDEM_TEST_AMQP_URL", \
                               "RabbitMQ broker", "amqp://guest:guest@127.0.0.1:PORT/")

namespace idem::test {

// Connection options for the test broker, with quick reconnects.
inline rabbitmq::ConnectionOptions amqp_test_options() {
  auto options = rabbitmq::ConnectionOptions::from_url(amqp_url());
  options.initial_backoff = std::chrono::milliseconds(50);
  options.max_backoff = std::chrono::milliseconds(500);
  return options;
}

class TestTopology {
 public:
  TestTopology() : id_(new_event_id().substr(0, 12)) {}
  TestTopology(const TestTopology&) = delete;
  TestTopology& operator=(const TestTopology&) = delete;
  ~TestTopology() {
    try {
      const auto options = amqp_test_options();
      for (const auto& queue : queues_)
        rabbitmq::delete_queue(options, queue);
      rabbitmq::delete_exchange(options, exchange());
    } catch (...) {
      // The broker may be down after a fault test; the node's data dir is temporary anyway.
    }
  }

  std::string exchange() const { return "idemtest." + id_ + ".events"; }
  std::string consumer(std::string_view name) const {
    return "idemtest-" + id_ + "-" + std::string(name);
  }

  // Consumer options for `name` on this topology's exchange; its queues are deleted at the end.
  rabbitmq::ConsumerOptions consumer_options(
      std::string_view name, rabbitmq::ExchangeType type = rabbitmq::ExchangeType::topic) {
    rabbitmq::ConsumerOptions options;
    options.consumer_name = consumer(name);
    options.exchange = exchange();
    options.exchange_type = type;
    queues_.push_back("idem." + options.consumer_name);
    queues_.push_back("idem." + options.consumer_name + ".dlq");
    return options;
  }

  rabbitmq::PublisherOptions publisher_options(
      rabbitmq::ExchangeType type = rabbitmq::ExchangeType::topic) const {
    rabbitmq::PublisherOptions options;
    options.exchange = exchange();
    options.exchange_type = type;
    return options;
  }

 private:
  std::string id_;
  std::vector<std::string> queues_;
};

// A Consumer that connects when it is made: its queue exists before anything is published.
class ConnectedConsumer : public rabbitmq::Consumer {
 public:
  ConnectedConsumer(rabbitmq::ConnectionOptions connection, rabbitmq::ConsumerOptions options)
      : rabbitmq::Consumer(std::move(connection), std::move(options)) {
    connect();
  }
};

// The fixture of the tests that run consumers and a publisher on a topology of their own.
class RabbitMqTopologyTest : public ::testing::Test {
 protected:
  ConnectedConsumer connected_consumer(const rabbitmq::ConsumerOptions& options) const {
    return ConnectedConsumer(connection_, options);
  }
  // A publisher to the topology's exchange.
  rabbitmq::Publisher topology_publisher() const {
    return rabbitmq::Publisher(connection_, topology_.publisher_options());
  }

  TestTopology topology_;
  rabbitmq::ConnectionOptions connection_ = amqp_test_options();
};

// Publishes one message straight through rabbitmq-c, bypassing idem's checks: `message_id`
// nullopt sends none. Persistent; no confirm needed (the test's later reads go over the same
// broker and AMQP keeps one connection's publishes in order; the consumer polls until it sees
// them).
inline void publish_raw(const std::string& exchange, const std::string& routing_key,
                        const std::optional<std::string>& message_id, const std::string& body) {
  const auto options = rabbitmq::ConnectionOptions::from_url(amqp_url());
  amqp_connection_state_t connection = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(connection);
  if (amqp_socket_open(socket, options.host.c_str(), options.port) != AMQP_STATUS_OK) {
    amqp_destroy_connection(connection);
    throw std::runtime_error("publish_raw: cannot connect");
  }
  const amqp_rpc_reply_t login =
      amqp_login(connection, options.vhost.c_str(), 0, AMQP_DEFAULT_FRAME_SIZE, 0,
                 AMQP_SASL_METHOD_PLAIN, options.user.c_str(), options.password.c_str());
  if (login.reply_type != AMQP_RESPONSE_NORMAL) {
    amqp_destroy_connection(connection);
    throw std::runtime_error("publish_raw: login failed");
  }
  amqp_channel_open(connection, 1);
  amqp_basic_properties_t properties{};
  properties._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
  properties.delivery_mode = AMQP_DELIVERY_PERSISTENT;
  if (message_id) {
    properties._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    properties.message_id = amqp_bytes_t{message_id->size(), const_cast<char*>(message_id->data())};
  }
  const int status = amqp_basic_publish(connection, 1, amqp_cstring_bytes(exchange.c_str()),
                                        amqp_cstring_bytes(routing_key.c_str()), 0, 0, &properties,
                                        amqp_bytes_t{body.size(), const_cast<char*>(body.data())});
  // A clean close makes the broker process everything sent before it.
  amqp_channel_close(connection, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(connection, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(connection);
  if (status != AMQP_STATUS_OK) throw std::runtime_error("publish_raw: publish failed");
}

// The broker-control command line of scripts/servers.sh (IDEM_TEST_RABBITMQCTL), "" when unset.
inline std::string rabbitmqctl() {
  return env("IDEM_TEST_RABBITMQCTL");
}

// Runs `rabbitmqctl <verb>` (e.g. stop_app, start_app) on the test broker; true on success.
// Runs `rabbitmqctl VERB`; on failure prints what it said, so a failed set-up step explains
// itself in the test log.
inline bool broker_command(const std::string& verb) {
  std::string output;
  FILE* pipe = ::popen((rabbitmqctl() + " " + verb + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return false;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr)
    output += buffer;
  const int status = ::pclose(pipe);
  if (status == 0) return true;
  std::fprintf(stderr, "rabbitmqctl %s failed (status %d):\n%s\n", verb.c_str(), status,
               output.c_str());
  return false;
}

// Starts the broker application again if a failed assertion left it stopped.
class BrokerGuard {
 public:
  BrokerGuard() = default;
  BrokerGuard(const BrokerGuard&) = delete;
  BrokerGuard& operator=(const BrokerGuard&) = delete;
  ~BrokerGuard() {
    if (stopped) broker_command("start_app");
  }
  bool stopped = false;
};

}  // namespace idem::test
