// RedisOptions without a server: defaults, URL parsing, validation (every bad field names
// itself), and what a pool does when nothing listens on the port (fails fast, retryable).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "../free_port.hpp"
#include "idem/error.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"

namespace {

using idem::redis::RedisOptions;
using namespace std::chrono_literals;

// Throws ConfigError whose message contains `part`.
void expect_config_error(const std::string& url, const std::string& part) {
  try {
    (void)RedisOptions::from_url(url);
    ADD_FAILURE() << "'" << url << "' was accepted";
  } catch (const idem::ConfigError& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::config_error);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "'" << url << "': " << e.what() << " (expected it to name " << part << ")";
  }
}

void expect_invalid(const RedisOptions& options, const std::string& field) {
  try {
    options.validate();
    ADD_FAILURE() << "options with a bad " << field << " were accepted";
  } catch (const idem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

// A TCP port on 127.0.0.1 where nothing listens.
int closed_port() {
  return idem::test::unused_loopback_port();
}

TEST(RedisOptions, DefaultsAreDocumented) {
  const RedisOptions options;
  EXPECT_EQ(options.host, "127.0.0.1");
  EXPECT_EQ(options.port, 6379);
  EXPECT_EQ(options.db, 0);
  EXPECT_FALSE(options.username.has_value());
  EXPECT_FALSE(options.password.has_value());
  EXPECT_EQ(options.connect_timeout, 1s);
  EXPECT_EQ(options.command_timeout, 2s);
  EXPECT_EQ(options.pool_size, 8u);
  EXPECT_EQ(options.wait_timeout, 1s);
  EXPECT_EQ(options.key_prefix, "idem:");
  EXPECT_FALSE(options.marker_ttl.has_value());
  EXPECT_EQ(options.expiry_slack, 1h);
  EXPECT_EQ(options.scan_count, 1000u);
  EXPECT_EQ(options.clock, nullptr);
  EXPECT_NO_THROW(options.validate());
  EXPECT_EQ(options.endpoint(), "127.0.0.1:6379/0");
}

TEST(RedisOptions, UrlWithEverything) {
  const auto options = RedisOptions::from_url(
      "redis://alice:s%3Acret@cache.internal:6380/2?prefix=app:&pool_size=16&connect_timeout_ms="
      "250&command_timeout_ms=750&wait_timeout_ms=0&marker_ttl_ms=86400000&expiry_slack_ms=5000&"
      "scan_count=50");
  EXPECT_EQ(options.host, "cache.internal");
  EXPECT_EQ(options.port, 6380);
  EXPECT_EQ(options.db, 2);
  EXPECT_EQ(options.username, std::optional<std::string>("alice"));
  EXPECT_EQ(options.password, std::optional<std::string>("s:cret"));
  EXPECT_EQ(options.key_prefix, "app:");
  EXPECT_EQ(options.pool_size, 16u);
  EXPECT_EQ(options.connect_timeout, 250ms);
  EXPECT_EQ(options.command_timeout, 750ms);
  EXPECT_EQ(options.wait_timeout, 0ms);
  EXPECT_EQ(options.marker_ttl, std::optional<std::chrono::milliseconds>(24h));
  EXPECT_EQ(options.expiry_slack, 5s);
  EXPECT_EQ(options.scan_count, 50u);
  EXPECT_EQ(options.endpoint(), "cache.internal:6380/2") << "never the password";
}

TEST(RedisOptions, MinimalUrlsKeepDefaults) {
  auto options = RedisOptions::from_url("redis://localhost");
  EXPECT_EQ(options.host, "localhost");
  EXPECT_EQ(options.port, 6379);
  EXPECT_EQ(options.db, 0);
  EXPECT_EQ(options.key_prefix, "idem:");

  options = RedisOptions::from_url("redis://127.0.0.1:7000/");
  EXPECT_EQ(options.port, 7000);
  EXPECT_EQ(options.db, 0);

  options = RedisOptions::from_url("redis://h?prefix=x:");
  EXPECT_EQ(options.key_prefix, "x:");

  options = RedisOptions::from_url("redis://:only-password@h/3");
  EXPECT_FALSE(options.username.has_value());
  EXPECT_EQ(options.password, std::optional<std::string>("only-password"));
  EXPECT_EQ(options.db, 3);

  options = RedisOptions::from_url("redis://[::1]:6390/1");
  EXPECT_EQ(options.host, "::1");
  EXPECT_EQ(options.port, 6390);
  EXPECT_EQ(options.endpoint(), "[::1]:6390/1");

  // A hash tag in the prefix, percent-encoded or not; an empty prefix.
  EXPECT_EQ(RedisOptions::from_url("redis://h?prefix=%7Bapp%7D:").key_prefix, "{app}:");
  EXPECT_EQ(RedisOptions::from_url("redis://h?prefix={app}:").key_prefix, "{app}:");
  EXPECT_EQ(RedisOptions::from_url("redis://h?prefix=").key_prefix, "");
}

TEST(RedisOptions, BadUrlsNameTheirPart) {
  expect_config_error("", "redis://");
  expect_config_error("http://localhost", "scheme 'http'");
  expect_config_error("redis://localhost?tls_ca_file=/ca.pem", "use a rediss:// URL");
  expect_config_error("rediss://localhost?tls_verify=maybe", "yes or no");
  expect_config_error("redis://", "host");
  expect_config_error("redis://:6379", "host");
  expect_config_error("redis://h:", "port is empty");
  expect_config_error("redis://h:0", "port");
  expect_config_error("redis://h:65536", "port");
  expect_config_error("redis://h:12ab", "port");
  expect_config_error("redis://h:-1", "port");
  expect_config_error("redis://h/x", "database");
  expect_config_error("redis://h/-1", "database");
  expect_config_error("redis://h/99999999999", "database");
  expect_config_error("redis://h?pool_size=0", "pool_size");
  expect_config_error("redis://h?pool_size=many", "parameter 'pool_size'");
  expect_config_error("redis://h?colour=blue", "unknown parameter 'colour'");
  expect_config_error("redis://h?prefix", "parameter 'prefix' has no value");
  expect_config_error("redis://h?prefix=%zz", "%-escape");
  expect_config_error("redis://h?prefix=%4", "%-escape");
  expect_config_error("redis://h?connect_timeout_ms=0", "connect_timeout");
  expect_config_error("redis://h?command_timeout_ms=-5", "command_timeout_ms");
  expect_config_error("redis://h?marker_ttl_ms=0", "marker_ttl");
  expect_config_error("redis://h?scan_count=0", "scan_count");
  expect_config_error("redis://h#frag", "fragment");
  expect_config_error("redis://h/0?prefix=a#frag", "fragment");
  expect_config_error("redis://user@h", "user info");
  expect_config_error("redis://[::1", "']'");
  expect_config_error("redis://[::1]x", "after the host");
  expect_config_error("redis://h?prefix=a%0Ab", "key_prefix");  // a control character
}

TEST(RedisOptions, PasswordsNeverAppearInMessages) {
  try {
    (void)RedisOptions::from_url("redis://:hunter2%zz@h");
    FAIL() << "a malformed escape in the password was accepted";
  } catch (const idem::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("password"), std::string::npos) << e.what();
  }
}

TEST(RedisOptions, ValidateNamesTheField) {
  RedisOptions options;
  options.host = "";
  expect_invalid(options, "host");
  options = {};
  options.host = "bad\nhost";
  expect_invalid(options, "host");
  options = {};
  options.port = 0;
  expect_invalid(options, "port");
  options = {};
  options.db = -1;
  expect_invalid(options, "db");
  options = {};
  options.username = "alice";
  expect_invalid(options, "username");
  options = {};
  options.connect_timeout = 0ms;
  expect_invalid(options, "connect_timeout");
  options = {};
  options.command_timeout = -1ms;
  expect_invalid(options, "command_timeout");
  options = {};
  options.wait_timeout = -1ms;
  expect_invalid(options, "wait_timeout");
  options = {};
  options.pool_size = 0;
  expect_invalid(options, "pool_size");
  options = {};
  options.key_prefix = std::string(129, 'p');
  expect_invalid(options, "key_prefix");
  options = {};
  options.key_prefix = std::string("a\0b", 3);
  expect_invalid(options, "key_prefix");
  options = {};
  options.marker_ttl = 0ms;
  expect_invalid(options, "marker_ttl");
  options = {};
  options.expiry_slack = -1ms;
  expect_invalid(options, "expiry_slack");
  options = {};
  options.scan_count = 0;
  expect_invalid(options, "scan_count");
}

TEST(RedisOptions, ConstructorsValidate) {
  RedisOptions options;
  options.pool_size = 0;
  EXPECT_THROW(idem::redis::ConnectionPool{options}, idem::ConfigError);
  EXPECT_THROW(idem::redis::RedisIdempotencyRecorder{options}, idem::ConfigError);
  EXPECT_THROW(idem::redis::RedisIdempotencyStore{options}, idem::ConfigError);
  EXPECT_THROW(
      idem::redis::RedisIdempotencyRecorder{std::shared_ptr<idem::redis::ConnectionPool>()},
      idem::InvalidArgument);
}

TEST(RedisFailure, HasStableNames) {
  using idem::redis::RedisFailure;
  EXPECT_EQ(idem::redis::to_string(RedisFailure::connect), "connect");
  EXPECT_EQ(idem::redis::to_string(RedisFailure::pool_exhausted), "pool_exhausted");
  EXPECT_EQ(idem::redis::to_string(RedisFailure::io), "io");
  EXPECT_EQ(idem::redis::to_string(RedisFailure::auth), "auth");
  EXPECT_EQ(idem::redis::to_string(RedisFailure::protocol), "protocol");
  EXPECT_EQ(idem::redis::to_string(RedisFailure::reply), "reply");
}

// Nothing listens: the lease fails at once with a retryable connect error (no retry loop), and
// so do the constructors, which check the server.
TEST(RedisConnectionPool, ServerDownFailsFastAndRetryable) {
  RedisOptions options;
  options.port = closed_port();
  idem::redis::ConnectionPool pool(options);
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      auto lease = pool.lease();
      FAIL() << "a lease on a closed port succeeded";
    } catch (const idem::redis::RedisError& e) {
      EXPECT_EQ(e.failure(), idem::redis::RedisFailure::connect);
      EXPECT_EQ(e.code(), idem::ErrorCode::store_error);
      EXPECT_TRUE(e.retryable());
      EXPECT_FALSE(e.in_doubt());
      EXPECT_NE(std::string(e.what()).find(options.endpoint()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
    }
  }
  const auto stats = pool.stats();
  EXPECT_EQ(stats.open, 0u) << "a failed connect must give its slot back";
  EXPECT_EQ(stats.connect_failures, 3u);
  EXPECT_EQ(stats.connects, 0u);
  EXPECT_THROW(idem::redis::RedisIdempotencyRecorder{options}, idem::redis::RedisError);
  EXPECT_THROW(idem::redis::RedisIdempotencyStore{options}, idem::redis::RedisError);
}

}  // namespace
