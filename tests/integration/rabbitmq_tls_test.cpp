// RabbitMQ over TLS (amqps://) against the broker's TLS listener of scripts/servers.sh
// (IDEM_TEST_AMQPS_URL: verify_peer + fail_if_no_peer_cert; certificates in IDEM_TEST_TLS_DIR):
//   * from the URL (CA, client certificate and key, password from password_file=), a publisher
//     and a consumer exchange events, and the consumer's reconnect (the broker closes its
//     connections) comes back over TLS;
//   * a wrong CA, a host name mismatch, no client certificate, a client certificate from another
//     CA, amqps:// to the plain port and amqp:// to the TLS port are refused with a non-retryable
//     BrokerError (store_open_failed) whose message says "TLS: " and the cause;
//   * settings that cannot work (TLS parameters on amqp://, verify without a CA file, a
//     certificate without its key, an unknown parameter) are ConfigErrors, without the password.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

namespace {

using namespace std::chrono_literals;
using idem::rabbitmq::BrokerError;
using idem::rabbitmq::ConnectionOptions;

using idem::test::env;

class RabbitMqTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env("IDEM_TEST_AMQPS_URL").empty() || env("IDEM_TEST_TLS_DIR").empty())
      IDEM_SERVER_MISSING("no TLS RabbitMQ listener: IDEM_TEST_AMQPS_URL is not set");
    tls_ = env("IDEM_TEST_TLS_DIR");
    tls_port_ = env("IDEM_TEST_AMQPS_PORT");
    plain_port_ = env("IDEM_TEST_AMQP_PORT");
  }

  ConnectionOptions good() const {
    ConnectionOptions o = ConnectionOptions::from_url(env("IDEM_TEST_AMQPS_URL"));
    o.initial_backoff = 50ms;
    o.max_backoff = 200ms;
    o.connect_timeout = 20s;  // a refusal must come from TLS, long before this
    return o;
  }

  // The BrokerError a Publisher's first publish throws (it connects on demand) — or its
  // construction.
  BrokerError refusal(const ConnectionOptions& o) const {
    try {
      idem::rabbitmq::PublisherOptions p;
      p.exchange = "amq.topic";
      idem::rabbitmq::Publisher publisher(o, p);
      publisher.publish(idem::Event::make("tls.refused", "x"));
    } catch (const BrokerError& e) {
      return e;
    }
    ADD_FAILURE() << "connected, but should have been refused";
    return BrokerError("", true);
  }

  static void expect_tls_refusal(const BrokerError& e, const std::string& cause) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << what;
    EXPECT_FALSE(e.retryable()) << what;
    EXPECT_NE(what.find("TLS: "), std::string::npos) << what;
    EXPECT_NE(what.find(cause), std::string::npos) << what;
    EXPECT_EQ(what.find("guest:"), std::string::npos) << what;
  }

  std::string tls_;
  std::string tls_port_;
  std::string plain_port_;
};

TEST_F(RabbitMqTls, UrlParsesTlsParameters) {
  const ConnectionOptions o = ConnectionOptions::from_url(
      "amqps://u:secret@broker.example/vh?cacertfile=/etc/ca.pem&certfile=/c.pem&keyfile=/k.pem"
      "&password_file=/run/pw&key_password_env=KEYPW");
  EXPECT_TRUE(o.tls);
  EXPECT_EQ(o.port, 5671);
  EXPECT_EQ(o.ca_cert_file, "/etc/ca.pem");
  EXPECT_EQ(o.cert_file, "/c.pem");
  EXPECT_EQ(o.key_file, "/k.pem");
  EXPECT_EQ(o.password_file, "/run/pw");
  EXPECT_EQ(o.key_password_env, "KEYPW");
  EXPECT_EQ(o.vhost, "vh");
  EXPECT_TRUE(o.verify_peer);
  EXPECT_TRUE(o.verify_hostname);
  EXPECT_EQ(o.describe(), "amqps://u@broker.example:5671/vh");
  const ConnectionOptions loose =
      ConnectionOptions::from_url("amqps://h/?verify=verify_none&server_name_indication=disable");
  EXPECT_FALSE(loose.verify_peer);
  EXPECT_FALSE(loose.verify_hostname);
  const ConnectionOptions plain = ConnectionOptions::from_url("amqp://h/?password_env=PW");
  EXPECT_FALSE(plain.tls);
  EXPECT_EQ(plain.password_env, "PW");
  const auto refused = [](const std::string& url) {
    try {
      (void)ConnectionOptions::from_url(url);
    } catch (const idem::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused("amqp://u:secret@h/?cacertfile=/ca.pem"));  // TLS needs amqps://
  EXPECT_TRUE(refused("amqps://u:secret@h/?bogus=1"));
  EXPECT_TRUE(refused("amqps://u:secret@h/?verify=maybe"));
  EXPECT_TRUE(refused("amqps://u:secret@h/?cacertfile=a&cacertfile=b"));
  EXPECT_TRUE(refused("amqps://u:secret@h/?cacertfile=%zz"));
}

TEST_F(RabbitMqTls, SettingsThatCannotWorkAreConfigErrors) {
  ConnectionOptions o = good();
  o.ca_cert_file.clear();  // verify_peer without a CA
  EXPECT_THROW(idem::rabbitmq::Publisher(o, {}), idem::ConfigError);
  o = good();
  o.key_file.clear();
  EXPECT_THROW(idem::rabbitmq::Publisher(o, {}), idem::ConfigError);
  o = good();
  o.password_file = tls_ + "/no-such-file";
  EXPECT_THROW(idem::rabbitmq::Publisher(o, {}), idem::ConfigError);
  o = good();
  o.password_file = tls_ + "/pg-password";
  o.password_env = "X";
  EXPECT_THROW(idem::rabbitmq::Publisher(o, {}), idem::ConfigError);
}

TEST_F(RabbitMqTls, PublishAndConsumeOverTlsAndReconnectOverTls) {
  idem::test::TempDir dir;
  const std::string password_file = (dir.path() / "amqp-password").string();
  std::ofstream(password_file) << "guest\n";
  ConnectionOptions o = ConnectionOptions::from_url(
      "amqps://guest@localhost:" + tls_port_ + "/?cacertfile=" + tls_ + "/ca.crt&certfile=" + tls_ +
      "/client.crt&keyfile=" + tls_ + "/client.key&password_file=" + password_file);
  o.password = "not-the-password";  // password_file wins
  o.initial_backoff = 50ms;
  o.max_backoff = 200ms;

  idem::test::TestTopology topology;
  idem::rabbitmq::Consumer consumer(o, topology.consumer_options("tls"));
  consumer.connect();
  idem::rabbitmq::Publisher publisher(o, topology.publisher_options());
  std::vector<std::string> seen;
  idem::test::FnHandler handler(topology.consumer("tls"),
                                [&](const idem::Event& event, idem::BusProxy&) {
                                  seen.push_back(event.id);
                                  return idem::HandleResult::processed;
                                });
  const idem::Event first = idem::Event::make("tls.one", "over TLS");
  publisher.publish(first);
  ASSERT_TRUE(consumer.run_until(handler, [&] { return !seen.empty(); }));
  EXPECT_EQ(seen.front(), first.id);

  // The broker drops its TLS connections; the consumer reconnects to the TLS port with the
  // same settings (a plain connection would be refused there) and keeps consuming.
  ASSERT_TRUE(idem::test::broker_command(
      "eval '[rabbit_networking:close_connection(P, \"tls test\") || "
      "P <- rabbit_networking:connections(), "
      "rabbit_networking:connection_info(P, [ssl]) =:= [{ssl, true}]].'"));
  const idem::Event second = idem::Event::make("tls.two", "after the reconnect");
  bool sent = false;
  for (int i = 0; i < 50 && !sent; ++i) {  // the publisher reconnects too
    try {
      publisher.publish(second);
      sent = true;
    } catch (const BrokerError& e) {
      ASSERT_TRUE(e.retryable()) << e.what();
    }
  }
  ASSERT_TRUE(sent);
  ASSERT_TRUE(consumer.run_until(
      handler, [&] { return std::find(seen.begin(), seen.end(), second.id) != seen.end(); }));
  EXPECT_GE(consumer.stats().reconnects, 1u);
}

TEST_F(RabbitMqTls, WrongCaIsRefused) {
  ConnectionOptions o = good();
  o.ca_cert_file = tls_ + "/other-ca.crt";
  expect_tls_refusal(refusal(o), "not trusted");
}

TEST_F(RabbitMqTls, HostNameMismatchIsRefused) {
  ConnectionOptions o = good();
  o.host = "127.0.0.1";  // the certificate names DNS:localhost only
  expect_tls_refusal(refusal(o), "host name mismatch");
}

TEST_F(RabbitMqTls, MissingOrForeignClientCertificateIsRefused) {
  ConnectionOptions o = good();
  o.cert_file.clear();
  o.key_file.clear();
  expect_tls_refusal(refusal(o), "client certificate");
  o.cert_file = tls_ + "/rogue-client.crt";
  o.key_file = tls_ + "/rogue-client.key";
  expect_tls_refusal(refusal(o), "client certificate");
}

TEST_F(RabbitMqTls, TlsToThePlainPortIsRefused) {
  ConnectionOptions o = good();
  o.port = std::stoi(plain_port_);
  expect_tls_refusal(refusal(o), "handshake failed");
}

TEST_F(RabbitMqTls, PlaintextToTheTlsPortFailsAtOnce) {
  ConnectionOptions o = good();
  o.tls = false;
  o.ca_cert_file.clear();
  o.cert_file.clear();
  o.key_file.clear();
  const BrokerError e = refusal(o);
  expect_tls_refusal(e, "amqps://");
}

}  // namespace
