// RedisOptions::from_url takes the password from a file (password_file=) or an environment
// variable (password_env=) instead of the user info (an ACL user: "redis://user:@host"); at most
// one source; never printed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/redis/redis_options.hpp"

namespace {

using idem::redis::RedisOptions;

TEST(RedisSecret, PasswordFromAFileOrTheEnvironment) {
  idem::test::TempDir dir;
  const std::string file = (dir.path() / "pw").string();
  std::ofstream(file) << "file-secret\n";
  const RedisOptions a = RedisOptions::from_url("redis://app:@h:6379/0?password_file=" + file);
  EXPECT_EQ(a.password, "file-secret");
  EXPECT_EQ(a.username, "app");
  ::setenv("IDEM_REDIS_SECRET_TEST", "env-secret", 1);
  const RedisOptions b = RedisOptions::from_url("redis://h/0?password_env=IDEM_REDIS_SECRET_TEST");
  EXPECT_EQ(b.password, "env-secret");
  EXPECT_FALSE(b.username.has_value());
  ::unsetenv("IDEM_REDIS_SECRET_TEST");
}

TEST(RedisSecret, OneSourceAndNoSecretInMessages) {
  idem::test::TempDir dir;
  const std::string file = (dir.path() / "pw").string();
  std::ofstream(file) << "file-secret\n";
  for (const std::string& url :
       {"redis://:inline-secret@h/0?password_file=" + file,
        "redis://h/0?password_file=" + file + "&password_env=HOME",
        "redis://h/0?password_file=" + (dir.path() / "missing").string(),
        std::string("redis://h/0?password_env=IDEM_REDIS_SECRET_TEST_UNSET")}) {
    ::unsetenv("IDEM_REDIS_SECRET_TEST_UNSET");
    try {
      (void)RedisOptions::from_url(url);
      ADD_FAILURE() << url;
    } catch (const idem::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("inline-secret"), std::string::npos) << what;
      EXPECT_EQ(what.find("file-secret"), std::string::npos) << what;
    }
  }
}

}  // namespace
