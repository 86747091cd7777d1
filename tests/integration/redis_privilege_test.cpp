// idem on Redis under the least rights of docs/security.md: an ACL user limited to idem's key
// prefix and exactly the commands idem sends (those scripts call included). Every recorder and
// store call works under it; a prefix outside its key pattern, or a command outside its list,
// fails with a classified idem::Error (NOPERM, not retryable), never a crash.
// Needs IDEM_TEST_REDIS_URL (scripts/servers.sh); skipped without it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "privilege_calls.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;

class RedisPrivilege : public ::testing::Test {
 protected:
  void SetUp() override {
    user_ = "idem_app_" + std::to_string(::getpid());
    const std::vector<std::string> rule =
        idem::test::redis_app_acl_rule(user_, password_, prefix_.prefix());
    std::vector<std::string_view> args(rule.begin(), rule.end());
    auto connection = admin_pool_.lease();
    const auto reply = connection->command(std::span<const std::string_view>(args));
    ASSERT_FALSE(reply.is_error()) << reply.str;
  }
  void TearDown() override {
    auto connection = admin_pool_.lease();
    (void)connection->command({"ACL", "DELUSER", user_});
  }

  idem::redis::RedisOptions as_app(std::string prefix) const {
    idem::redis::RedisOptions options = prefix_.options();
    options.key_prefix = std::move(prefix);
    options.username = user_;
    options.password = password_;
    return options;
  }

  idem::test::RedisTestPrefix prefix_{"acl"};
  idem::redis::ConnectionPool admin_pool_{prefix_.options()};
  std::string user_;
  std::string password_ = "acl-test-password";
};

TEST_F(RedisPrivilege, EveryCallWorksUnderTheDocumentedRule) {
  idem::redis::RedisIdempotencyRecorder recorder(as_app(prefix_.prefix()));
  idem::test::every_recorder_call_works(recorder);
  idem::redis::RedisIdempotencyStore store(as_app(prefix_.prefix()));
  idem::test::every_store_call_works(store);
}

TEST_F(RedisPrivilege, AKeyOutsideThePatternIsRefusedWithAClassifiedError) {
  idem::redis::RedisIdempotencyRecorder recorder(as_app("not-" + prefix_.prefix()));
  try {
    recorder.mark_processed("c", "e1");
    FAIL() << "wrote outside the ACL key pattern";
  } catch (const idem::Error& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_error) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(password_), std::string::npos) << e.what();
  }
  idem::redis::RedisIdempotencyStore store(as_app("not-" + prefix_.prefix()));
  EXPECT_THROW((void)store.claim("k", std::nullopt, 5s), idem::Error);
}

TEST_F(RedisPrivilege, ACommandOutsideTheListIsRefused) {
  idem::redis::ConnectionPool pool(as_app(prefix_.prefix()));
  auto connection = pool.lease();
  for (const auto& args : std::vector<std::vector<std::string_view>>{
           {"FLUSHDB"}, {"KEYS", "*"}, {"CONFIG", "GET", "*"}, {"ACL", "LIST"}}) {
    const auto reply = connection->command(std::span<const std::string_view>(args));
    ASSERT_TRUE(reply.is_error()) << args.front();
    EXPECT_NE(reply.str.find("NOPERM"), std::string::npos) << reply.str;
  }
}

TEST_F(RedisPrivilege, AWrongPasswordIsAClassifiedRefusal) {
  idem::redis::RedisOptions options = as_app(prefix_.prefix());
  options.password = "not-the-password";
  try {
    idem::redis::RedisIdempotencyRecorder recorder(options);
    (void)recorder.is_processed("c", "e");
    FAIL() << "AUTH accepted a wrong password";
  } catch (const idem::Error& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << e.what();
    EXPECT_FALSE(e.retryable());
    EXPECT_EQ(std::string(e.what()).find("not-the-password"), std::string::npos) << e.what();
  }
}

}  // namespace
