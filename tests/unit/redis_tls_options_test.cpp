// RedisTlsOptions is idem::TlsOptions (idem/tls_options.hpp), the one TLS settings struct: code
// written against either name, with the fields and defaults the Redis backend always had,
// compiles and means the same.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <type_traits>

#include "idem/error.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/tls_options.hpp"

namespace {

static_assert(std::is_same_v<idem::redis::RedisTlsOptions, idem::TlsOptions>);

TEST(RedisTlsOptions, IsTheOneTlsOptionsStruct) {
  const idem::redis::RedisTlsOptions defaults;
  EXPECT_TRUE(defaults.ca_file.empty());
  EXPECT_TRUE(defaults.ca_dir.empty());
  EXPECT_TRUE(defaults.cert_file.empty());
  EXPECT_TRUE(defaults.key_file.empty());
  EXPECT_FALSE(defaults.key_password.has_value());
  EXPECT_TRUE(defaults.server_name.empty());
  EXPECT_TRUE(defaults.verify_peer);

  // Designated initializers in the order the fields always had.
  idem::redis::RedisOptions options;
  options.tls = idem::redis::RedisTlsOptions{.ca_file = "/etc/ca.pem",
                                             .ca_dir = "",
                                             .cert_file = "/c.pem",
                                             .key_file = "/k.pem",
                                             .key_password = std::nullopt,
                                             .server_name = "redis.internal",
                                             .verify_peer = true};
  EXPECT_NO_THROW(options.validate());
  options.tls = idem::TlsOptions{.key_file = "/k.pem"};  // a key without its certificate
  EXPECT_THROW(options.validate(), idem::ConfigError);

  const auto parsed = idem::redis::RedisOptions::from_url(
      "rediss://h?tls_ca_file=/ca.pem&tls_server_name=n&tls_verify=no");
  ASSERT_TRUE(parsed.tls.has_value());
  const idem::TlsOptions& tls = *parsed.tls;
  EXPECT_EQ(tls.ca_file, "/ca.pem");
  EXPECT_EQ(tls.server_name, "n");
  EXPECT_FALSE(tls.verify_peer);
}

}  // namespace
