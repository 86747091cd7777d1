// Redis over TLS (rediss://, RedisOptions::tls) on the blocking face, against scripts/servers.sh's
// TLS listener (IDEM_TEST_REDIS_TLS_PORT: the shared instance, --tls-auth-clients yes) and its
// TLS-only instance presenting an expired certificate (IDEM_TEST_REDIS_TLS_EXPIRED_PORT):
// recorder and store calls over mutual TLS, a pipelined batch, an ACL user, a reconnect after
// CLIENT KILL, idle connections kept (TLS 1.3 session tickets are not a hang-up), and every
// refusal — wrong CA, expired certificate, host name mismatch, no or a foreign client
// certificate, plaintext to the TLS port and TLS to the plaintext port — as a non-retryable
// RedisError (tls) naming its cause. redis_tls_async_test.cpp does the same for coroutines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "redis_tls_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::tls;

TEST_F(RedisTls, BlockingRecorderAndStoreWorkOverMutualTls) {
  RedisIdempotencyRecorder recorder(RedisOptions::from_url(tls_url()));
  EXPECT_FALSE(recorder.is_processed("c", "e1"));
  recorder.mark_processed("c", "e1");
  EXPECT_TRUE(recorder.is_processed("c", "e1"));
  // A pipelined batch: one write and one round trip over TLS.
  const std::vector<std::string> ids = {"b1", "b2", "b3", "e1"};
  EXPECT_EQ(recorder.mark_processed_batch("c", ids), 3u);
  EXPECT_EQ(recorder.is_processed_many("c", ids), (std::vector<bool>{true, true, true, true}));
  const Claim claim = recorder.claim("c", "x", 10s);
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  EXPECT_TRUE(recorder.complete("c", "x", claim.token));

  RedisIdempotencyStore store(tls_options());
  EXPECT_FALSE(store.lookup("k").has_value());
  const ClaimOutcome claimed = store.claim("k", std::string("fp"), 10s);
  ASSERT_EQ(claimed.status, ClaimOutcome::Status::acquired);
  StoredValue value;
  value.bytes = std::string("tls\0bytes", 9);
  ASSERT_TRUE(store.complete("k", claimed.token, value, ExecutionReport{}, 60s));
  const auto found = store.lookup("k");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->value.bytes, value.bytes);

  // The same server as the plaintext port: a plaintext store sees the record written over TLS.
  RedisIdempotencyStore plain(keys_.options());
  const auto seen = plain.lookup("k");
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->value.bytes, value.bytes);
  EXPECT_TRUE(RedisIdempotencyRecorder(keys_.options()).is_processed("c", "b2"));
}

TEST_F(RedisTls, IdleConnectionsAreKeptAndAKilledOneIsReplacedOverTls) {
  RedisIdempotencyRecorder recorder(tls_options());
  recorder.mark_processed("c", "e1");
  std::this_thread::sleep_for(100ms);  // session tickets, if any, have arrived meanwhile
  EXPECT_TRUE(recorder.is_processed("c", "e1"));
  EXPECT_EQ(recorder.pool()->stats().connects, 1u) << "an idle TLS connection was dropped";

  long long id = 0;
  {
    auto connection = recorder.pool()->lease();
    const RedisReply reply = connection->command({"CLIENT", "ID"}, CommandKind::read);
    ASSERT_EQ(reply.type, RedisReply::Type::integer);
    id = reply.integer;
  }
  keys_.command({"CLIENT", "KILL", "ID", std::to_string(id)});
  std::this_thread::sleep_for(50ms);
  // The killed connection is found dead when leased and replaced by a new TLS connection.
  EXPECT_TRUE(recorder.is_processed("c", "e1"));
  recorder.mark_processed("c", "e2");
  const auto stats = recorder.pool()->stats();
  EXPECT_EQ(stats.connects, 2u);
  EXPECT_GE(stats.dropped, 1u);
}

TEST_F(RedisTls, ServerNameAndVerifyOffAreHonoured) {
  // By IP address with the certificate's name given explicitly.
  RedisOptions by_ip = tls_options();
  by_ip.host = "127.0.0.1";
  by_ip.tls->server_name = "localhost";
  RedisIdempotencyRecorder named(by_ip);
  named.mark_processed("c", "n");
  EXPECT_TRUE(named.is_processed("c", "n"));

  // tls_verify=no: a CA that signed nothing and a mismatching host are accepted.
  RedisOptions unverified = tls_options();
  unverified.host = "127.0.0.1";
  unverified.tls->ca_file = tls_file("other-ca.crt");
  unverified.tls->verify_peer = false;
  EXPECT_TRUE(RedisIdempotencyRecorder(unverified).is_processed("c", "n"));
}

TEST_F(RedisTls, AnAclUserAuthenticatesOverTls) {
  const std::string user = "idem_tls_" + std::to_string(::getpid());
  const std::string password = "tls-secret-" + std::to_string(::getpid());
  const RedisReply made =
      keys_.command(idem::test::redis_app_acl_rule(user, password, keys_.prefix()));
  ASSERT_FALSE(made.is_error()) << made.str;
  struct Cleanup {
    const idem::test::RedisTestPrefix& keys;
    std::string user;
    ~Cleanup() { (void)keys.command({"ACL", "DELUSER", user}); }
  } cleanup{keys_, user};

  RedisOptions as_user = tls_options();
  as_user.username = user;
  as_user.password = password;
  RedisIdempotencyStore store(as_user);
  const ClaimOutcome claimed = store.claim("acl", std::nullopt, 10s);
  ASSERT_EQ(claimed.status, ClaimOutcome::Status::acquired);
  StoredValue value;
  value.bytes = "ok";
  EXPECT_TRUE(store.complete("acl", claimed.token, value, ExecutionReport{}, 60s));

  EXPECT_EQ(store.lookup("acl")->value.bytes, std::optional<std::string>("ok"));

  // A wrong password over TLS is still an auth refusal, not a TLS one.
  RedisOptions wrong = as_user;
  wrong.password = "not-it";
  try {
    (void)RedisIdempotencyRecorder(wrong).is_processed("c", "e");
    ADD_FAILURE() << "a wrong password was accepted";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::auth) << e.what();
    EXPECT_EQ(std::string(e.what()).find("not-it"), std::string::npos) << e.what();
  }
}

TEST_F(RedisTls, EveryRefusalIsANonRetryableTlsErrorNamingItsCause) {
  ASSERT_NE(port_of("IDEM_TEST_REDIS_TLS_EXPIRED_PORT"), 0);
  expect_every_refusal(
      tls_options(), "blocking",
      [](const RedisOptions& options) {
        RedisIdempotencyRecorder recorder(options);
        (void)recorder.is_processed("c", "e");
      },
      [](const RedisOptions& options) {
        RedisIdempotencyStore store(options);
        (void)store.claim("k", std::nullopt, 10s);
      });
  EXPECT_EQ(keys_.key_count(), 0u) << "a refused connection wrote something";
}

TEST_F(RedisTls, FilesThatCannotBeUsedAreConfigErrorsWhenThePoolIsMade) {
  const auto expect_config_error = [&](const std::function<void(RedisOptions&)>& change,
                                       const std::string& part) {
    RedisOptions options = tls_options();
    change(options);
    try {
      RedisIdempotencyRecorder recorder(options);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const idem::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_config_error([](RedisOptions& o) { o.tls->ca_file = "/nonexistent/ca.pem"; },
                      "cannot read ca_file '/nonexistent/ca.pem'");
  expect_config_error([](RedisOptions& o) { o.tls->key_file = tls_file("server.key"); },
                      "does not match cert_file");
  expect_config_error([](RedisOptions& o) { o.tls->cert_file = tls_file("ca.key"); },
                      "cannot use cert_file");
  expect_config_error([](RedisOptions& o) { o.tls->cert_file.clear(); }, "key_file is set without");
}

TEST_F(RedisTls, UrlParametersReachTheOptions) {
  const RedisOptions options = RedisOptions::from_url(
      "rediss://u:pw@localhost:6380/2?tls_ca_file=/a/ca.pem&tls_ca_dir=/a/certs"
      "&tls_cert_file=/a/c.pem&tls_key_file=/a/k.pem&tls_server_name=redis.internal"
      "&tls_verify=no");
  ASSERT_TRUE(options.tls.has_value());
  EXPECT_EQ(options.tls->ca_file, "/a/ca.pem");
  EXPECT_EQ(options.tls->ca_dir, "/a/certs");
  EXPECT_EQ(options.tls->cert_file, "/a/c.pem");
  EXPECT_EQ(options.tls->key_file, "/a/k.pem");
  EXPECT_EQ(options.tls->server_name, "redis.internal");
  EXPECT_FALSE(options.tls->verify_peer);
  EXPECT_TRUE(RedisOptions::from_url("rediss://h").tls->verify_peer);
  EXPECT_TRUE(RedisOptions::from_url("rediss://h").tls->ca_file.empty());
  EXPECT_FALSE(RedisOptions::from_url("redis://h").tls.has_value());
  EXPECT_THROW((void)RedisOptions::from_url("redis://h?tls_ca_file=/a"), idem::ConfigError);
  EXPECT_THROW((void)RedisOptions::from_url("rediss://h?tls_verify=maybe"), idem::ConfigError);
}

}  // namespace
