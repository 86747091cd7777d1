// open_recorder / open_store on a real Redis server (IDEM_TEST_REDIS_URL): every query parameter
// reaches RedisOptions, the scheme is matched without regard to case, and the opened objects
// work (markers, claims, store records) and share data through the server; rediss:// opens over
// TLS (IDEM_TEST_REDIS_TLS_PORT) and a certificate the client does not trust fails the open.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "idem/error.hpp"
#include "idem/open.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "idem/testing/manual_clock.hpp"
#include "open_cases.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;

// The server URL with `query` appended.
std::string url_with(const std::string& query) {
  const std::string base = idem::test::redis_url();
  return base + (base.find('?') == std::string::npos ? "?" : "&") + query;
}

TEST(RedisOpen, RecorderGetsEveryParameterAndWorks) {
  idem::test::RedisTestPrefix prefix("open");
  auto clock = std::make_shared<idem::testing::ManualClock>();
  const std::string url = url_with("prefix=" + prefix.prefix() +
                                   "&pool_size=3&connect_timeout_ms=700&command_timeout_ms=1500"
                                   "&wait_timeout_ms=250&marker_ttl_ms=60000"
                                   "&expiry_slack_ms=5000&scan_count=77");
  auto recorder = idem::open_recorder(url, {.clock = clock});
  auto* redis = dynamic_cast<idem::redis::RedisIdempotencyRecorder*>(recorder.get());
  ASSERT_NE(redis, nullptr);
  const auto& options = redis->pool()->options();
  EXPECT_EQ(options.key_prefix, prefix.prefix());
  EXPECT_EQ(options.pool_size, 3u);
  EXPECT_EQ(options.connect_timeout, 700ms);
  EXPECT_EQ(options.command_timeout, 1500ms);
  EXPECT_EQ(options.wait_timeout, 250ms);
  EXPECT_EQ(options.marker_ttl, std::optional<std::chrono::milliseconds>(60s));
  EXPECT_EQ(options.expiry_slack, 5s);
  EXPECT_EQ(options.scan_count, 77u);
  EXPECT_EQ(options.clock, clock);

  EXPECT_FALSE(recorder->is_processed("c", "e1"));
  recorder->mark_processed("c", "e1");
  EXPECT_TRUE(recorder->is_processed("c", "e1"));

  idem::test::expect_opened_recorder_claims(*recorder);

  // A second recorder opened from the same URL sees the first one's markers (upper-case scheme).
  std::string upper = url;
  upper.replace(0, 5, "REDIS");
  auto other = idem::open_recorder(upper);
  EXPECT_TRUE(other->is_processed("c", "e1"));
  EXPECT_FALSE(other->supports_transactions());
  EXPECT_GT(prefix.key_count(), 0u);
}

TEST(RedisOpen, StoreClaimsAndCompletes) {
  idem::test::RedisTestPrefix prefix("openstore");
  auto store = idem::open_store(url_with("prefix=" + prefix.prefix()));
  ASSERT_NE(dynamic_cast<idem::redis::RedisIdempotencyStore*>(store.get()), nullptr);
  EXPECT_TRUE(store->needs_bytes());
  idem::test::expect_opened_store_claims_and_replays(
      *store, [&] { return idem::open_store(url_with("prefix=" + prefix.prefix())); });
}

TEST(RedisOpen, WrongPasswordOrDatabaseFailsWhenOpened) {
  // The URL is fine but the server refuses: an error from the backend, never a ConfigError, and
  // never the password in the message.
  const std::string base = idem::test::redis_url();
  std::string with_password = base;
  with_password.insert(std::string("redis://").size(), ":hunter2@");
  try {
    (void)idem::open_recorder(with_password);
    ADD_FAILURE() << "a password the server does not expect was accepted";
  } catch (const idem::ConfigError& e) {
    ADD_FAILURE() << e.what();
  } catch (const idem::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

// rediss://localhost:TLS_PORT/0 with the test CA and client certificate, and `extra` appended.
std::string tls_url(const std::string& extra) {
  const std::string port = idem::test::env("IDEM_TEST_REDIS_TLS_PORT");
  const std::string dir = idem::test::env("IDEM_TEST_TLS_DIR");
  if (port.empty() || dir.empty()) return {};
  return "rediss://localhost:" + port + "/0?tls_cert_file=" + dir +
         "/client.crt&tls_key_file=" + dir + "/client.key&" + extra;
}

TEST(RedisOpen, RedissOpensOverTlsAndRefusesAnUntrustedServer) {
  if (tls_url("").empty())
    IDEM_SERVER_MISSING("no Redis TLS listener: IDEM_TEST_REDIS_TLS_PORT / IDEM_TEST_TLS_DIR");
  idem::test::RedisTestPrefix prefix("opentls");
  const std::string dir = idem::test::env("IDEM_TEST_TLS_DIR");
  const std::string ca = dir + "/ca.crt";
  auto recorder = idem::open_recorder(tls_url("tls_ca_file=" + ca + "&prefix=" + prefix.prefix()));
  auto* redis = dynamic_cast<idem::redis::RedisIdempotencyRecorder*>(recorder.get());
  ASSERT_NE(redis, nullptr);
  ASSERT_TRUE(redis->pool()->options().tls.has_value());
  EXPECT_EQ(redis->pool()->options().tls->ca_file, ca);
  recorder->mark_processed("c", "over-tls");
  // The same server as the plaintext URL.
  EXPECT_TRUE(
      idem::open_recorder(url_with("prefix=" + prefix.prefix()))->is_processed("c", "over-tls"));

  auto store = idem::open_store(tls_url("tls_ca_file=" + ca + "&prefix=" + prefix.prefix()));
  const auto claim = store->claim("k", std::nullopt, 10s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);

  // A CA that did not sign the server's certificate: the open fails, not as a ConfigError.
  try {
    (void)idem::open_recorder(
        tls_url("tls_ca_file=" + dir + "/other-ca.crt&prefix=" + prefix.prefix()));
    ADD_FAILURE() << "an untrusted server was accepted";
  } catch (const idem::ConfigError& e) {
    ADD_FAILURE() << e.what();
  } catch (const idem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TLS: certificate verify failed"), std::string::npos)
        << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
  }
}

}  // namespace
