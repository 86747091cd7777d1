// RedisOptions without a server: defaults, URL parsing, validation (every bad field names
// itself), and what a pool does when nothing listens on the port (fails fast, retryable).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

TEST(RedisOptions, ClusterUrlsListTheirNodes) {
  const auto options = idem::redis::RedisOptions::from_url(
      "rediss+cluster://app:pw@10.0.0.5:7000,[::1]:7001,node-c/0?prefix=orders:&pool_size=4");
  ASSERT_TRUE(options.is_cluster());
  ASSERT_EQ(options.cluster_nodes.size(), 3u);
  EXPECT_EQ(options.cluster_nodes[0].host, "10.0.0.5");
  EXPECT_EQ(options.cluster_nodes[0].port, 7000);
  EXPECT_EQ(options.cluster_nodes[1].host, "::1");
  EXPECT_EQ(options.cluster_nodes[1].port, 7001);
  EXPECT_EQ(options.cluster_nodes[2].host, "node-c");
  EXPECT_EQ(options.cluster_nodes[2].port, 6379);
  EXPECT_EQ(options.host, "10.0.0.5");  // the first node
  EXPECT_TRUE(options.tls.has_value());
  EXPECT_EQ(options.username, "app");
  EXPECT_EQ(options.key_prefix, "orders:");
  EXPECT_EQ(options.pool_size, 4u);
  EXPECT_EQ(options.endpoint(), "cluster 10.0.0.5:7000,[::1]:7001,node-c:6379");
  EXPECT_FALSE(idem::redis::RedisOptions::from_url("redis://h").is_cluster());
  EXPECT_TRUE(idem::redis::RedisOptions::from_url("redis+cluster://h").is_cluster());
}

TEST(RedisOptions, BadClusterUrlsNameTheirPart) {
  expect_config_error("redis://a:1,b:2", "redis+cluster://");
  expect_config_error("redis+cluster://a:1,b:2/3", "database 0 only");
  expect_config_error("redis+cluster://a:1,,b:2", "host is missing");
  expect_config_error("redis+cluster://a:1,b:0", "port");
  expect_config_error("redis+cluster://a?tls_ca_file=/ca.pem", "use a rediss:// URL");
  idem::redis::RedisOptions options;
  options.cluster_nodes = {{"h", 7000}};
  options.db = 2;
  EXPECT_THROW(options.validate(), idem::ConfigError);
}

TEST(RedisOptions, SentinelUrlsNameTheSentinelsAndThePrimary) {
  ::setenv("IDEM_TEST_SENTINEL_SECRET", "s3cret", 1);
  const auto options = RedisOptions::from_url(
      "rediss+sentinel://app:pw@10.0.0.5,10.0.0.6:26380/orders%2Dprimary/3?prefix=orders:&"
      "sentinel_user=watcher&sentinel_password_env=IDEM_TEST_SENTINEL_SECRET");
  ASSERT_TRUE(options.is_sentinel());
  EXPECT_FALSE(options.is_cluster());
  ASSERT_EQ(options.sentinel_nodes.size(), 2u);
  EXPECT_EQ(options.sentinel_nodes[0].host, "10.0.0.5");
  EXPECT_EQ(options.sentinel_nodes[0].port, 26379);  // Sentinel's own default port
  EXPECT_EQ(options.sentinel_nodes[1].port, 26380);
  EXPECT_EQ(options.sentinel_master, "orders-primary");
  EXPECT_EQ(options.db, 3);
  EXPECT_TRUE(options.tls.has_value());
  EXPECT_EQ(options.username, "app");  // the primary's credentials
  EXPECT_EQ(options.password, "pw");
  EXPECT_EQ(options.sentinel_username, "watcher");  // the sentinels' own
  EXPECT_EQ(options.sentinel_password, "s3cret");
  EXPECT_EQ(options.endpoint(), "sentinel orders-primary/3 via 10.0.0.5:26379,10.0.0.6:26380");
  EXPECT_EQ(options.endpoint().find("s3cret"), std::string::npos);
  EXPECT_EQ(RedisOptions::from_url("redis+sentinel://h/idem").db, 0);
  EXPECT_FALSE(RedisOptions::from_url("redis://h").is_sentinel());
}

TEST(RedisOptions, BadSentinelUrlsNameTheirPart) {
  expect_config_error("redis+sentinel://a,b", "master-name");
  expect_config_error("redis+sentinel://a,b/", "master-name");
  expect_config_error("redis+sentinel://a,b/idem/x", "database");
  expect_config_error("redis+sentinel://a,,b/idem", "host is missing");
  expect_config_error("redis+sentinel://a:0/idem", "port");
  expect_config_error("redis+sentinel://a/idem?tls_verify=no", "rediss+sentinel://");
  expect_config_error("redis://h?sentinel_user=x", "redis+sentinel://");
  expect_config_error("redis+sentinel://a/idem?sentinel_user=x", "sentinel_username");
  expect_config_error("redis://a:1,b:2", "redis+sentinel://");
  RedisOptions options;
  options.sentinel_nodes = {{"h", 26379}};
  EXPECT_THROW(options.validate(), idem::ConfigError);  // no master name
  options.sentinel_master = "a b";
  EXPECT_THROW(options.validate(), idem::ConfigError);  // a space would split the command
  options.sentinel_master = "idem";
  EXPECT_NO_THROW(options.validate());
  options.cluster_nodes = {{"h", 7000}};
  EXPECT_THROW(options.validate(), idem::ConfigError);  // a cluster does not use Sentinel
}

TEST(RedisOptions, MinReplicasAndItsTimeout) {
  const auto options = RedisOptions::from_url("redis://h?min_replicas=1&replica_timeout=300ms");
  EXPECT_EQ(options.min_replicas, 1u);
  EXPECT_EQ(options.replica_timeout, 300ms);
  EXPECT_EQ(RedisOptions{}.min_replicas, 0u);  // no wait unless asked
  EXPECT_EQ(RedisOptions::from_url("redis://h?replica_timeout_ms=250").replica_timeout, 250ms);
  expect_config_error("redis://h?min_replicas=1&replica_timeout=2s",
                      "shorter than command_timeout");
  expect_config_error("redis://h?min_replicas=101", "min_replicas");
  expect_config_error("redis://h?replica_timeout=0ms", "replica_timeout");
  expect_config_error("redis://h?min_replicas=x", "min_replicas");
  // Without min_replicas the timeout is unused, so a short command_timeout stays valid.
  EXPECT_NO_THROW(RedisOptions::from_url("redis://h?command_timeout=200ms"));
}

// The durations both spellings of one example URL give (the next two tests).
void expect_example_durations(const RedisOptions& options) {
  EXPECT_EQ(options.connect_timeout, 250ms);
  EXPECT_EQ(options.command_timeout, 3s);
  EXPECT_EQ(options.wait_timeout, 0ms);
  EXPECT_EQ(options.marker_ttl, std::optional<std::chrono::milliseconds>(7 * 24h));
  EXPECT_EQ(options.expiry_slack, 15min);
}

// The durations take the grammar of every idem URL (idem/duration.hpp); the older _ms names stay
// as aliases in bare milliseconds.
TEST(RedisOptions, DurationsTakeTheUrlGrammar) {
  const auto options = RedisOptions::from_url(
      "redis://h?connect_timeout=250ms&command_timeout=3s&wait_timeout=0ms&marker_ttl=7d&"
      "expiry_slack=15m");
  expect_example_durations(options);
  EXPECT_EQ(RedisOptions::from_url("redis://h?marker_ttl=12h").marker_ttl,
            std::optional<std::chrono::milliseconds>(12h));
  EXPECT_EQ(RedisOptions::from_url("redis://h?expiry_slack=1000d").expiry_slack, 1000 * 24h);
  // Percent-decoded like every value.
  EXPECT_EQ(RedisOptions::from_url("redis://h?command_timeout=5%73").command_timeout, 5s);
}

TEST(RedisOptions, MillisecondAliasesKeepTheirMeaning) {
  const auto options = RedisOptions::from_url(
      "redis://h?connect_timeout_ms=250&command_timeout_ms=3000&wait_timeout_ms=0&"
      "marker_ttl_ms=604800000&expiry_slack_ms=900000");
  expect_example_durations(options);
  // An alias takes a bare number, not a duration.
  expect_config_error("redis://h?connect_timeout_ms=1s", "parameter 'connect_timeout_ms'");
  expect_config_error("redis://h?marker_ttl_ms=7d", "non-negative integer");
}

TEST(RedisOptions, OneSettingIsGivenOnce) {
  for (const char* setting :
       {"connect_timeout", "command_timeout", "wait_timeout", "marker_ttl", "expiry_slack"}) {
    const std::string name(setting);
    // Both spellings, in either order.
    expect_config_error("redis://h?" + name + "=1s&" + name + "_ms=1000", "one way only");
    expect_config_error("redis://h?" + name + "_ms=1000&" + name + "=1s",
                        "'" + name + "_ms' and '" + name + "'");
    // One spelling twice.
    expect_config_error("redis://h?" + name + "=1s&" + name + "=2s",
                        "parameter '" + name + "' is given twice");
    expect_config_error("redis://h?" + name + "_ms=1&" + name + "_ms=2", "given twice");
  }
  expect_config_error("redis://h?prefix=a:&pool_size=2&prefix=b:", "'prefix' is given twice");
  // Other parameters that merely end in _ms are not aliases.
  expect_config_error("redis://h?scan_count_ms=5", "unknown parameter 'scan_count_ms'");
}

TEST(RedisOptions, BadDurationsNameTheirParameter) {
  expect_config_error("redis://h?connect_timeout=500", "no unit");
  expect_config_error("redis://h?connect_timeout=500", "parameter 'connect_timeout'");
  expect_config_error("redis://h?command_timeout=-5s", "negative");
  expect_config_error("redis://h?wait_timeout=1.5us", "unknown unit");
  expect_config_error("redis://h?wait_timeout=5sec", "unknown unit");
  expect_config_error("redis://h?marker_ttl=", "is empty");
  expect_config_error("redis://h?expiry_slack=1001d", "1000d");
  expect_config_error("redis://h?expiry_slack=99999999999999999999d", "too large");
  // In range for the grammar, out of range for the field.
  expect_config_error("redis://h?connect_timeout=0ms", "connect_timeout must be > 0");
  expect_config_error("redis://h?command_timeout=0s", "command_timeout must be > 0");
  expect_config_error("redis://h?marker_ttl=0d", "marker_ttl must be > 0");
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
  // Each case spoils one field of default options.
  const std::vector<std::pair<std::string, std::function<void(RedisOptions&)>>> cases = {
      {"host", [](RedisOptions& o) { o.host = ""; }},
      {"host", [](RedisOptions& o) { o.host = "bad\nhost"; }},
      {"port", [](RedisOptions& o) { o.port = 0; }},
      {"db", [](RedisOptions& o) { o.db = -1; }},
      {"username", [](RedisOptions& o) { o.username = "alice"; }},
      {"connect_timeout", [](RedisOptions& o) { o.connect_timeout = 0ms; }},
      {"command_timeout", [](RedisOptions& o) { o.command_timeout = -1ms; }},
      {"wait_timeout", [](RedisOptions& o) { o.wait_timeout = -1ms; }},
      {"pool_size", [](RedisOptions& o) { o.pool_size = 0; }},
      {"key_prefix", [](RedisOptions& o) { o.key_prefix = std::string(129, 'p'); }},
      {"key_prefix", [](RedisOptions& o) { o.key_prefix = std::string("a\0b", 3); }},
      {"marker_ttl", [](RedisOptions& o) { o.marker_ttl = 0ms; }},
      {"expiry_slack", [](RedisOptions& o) { o.expiry_slack = -1ms; }},
      {"scan_count", [](RedisOptions& o) { o.scan_count = 0; }},
  };
  for (const auto& [field, spoil] : cases) {
    RedisOptions options;
    spoil(options);
    expect_invalid(options, field);
  }
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
      EXPECT_EQ(e.code(), idem::ErrorCode::connection_refused);
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
