// Secrets kept out of URLs (idem/detail/secret.hpp), without servers: a file's content minus one
// trailing newline, an environment variable, at most one source, and errors that name the file
// or variable but never the secret; redact_url hides sslpassword= as it hides password=.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <functional>
#include <string>

#include "../temp_dir.hpp"
#include "idem/detail/secret.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"

namespace {

using idem::detail::read_secret_env;
using idem::detail::read_secret_file;
using idem::detail::resolve_secret;

std::string write(const idem::test::TempDir& dir, const std::string& name,
                  const std::string& content) {
  const std::string path = (dir.path() / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string config_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const idem::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

TEST(Secret, FileContentWithoutOneTrailingNewline) {
  idem::test::TempDir dir;
  EXPECT_EQ(read_secret_file("w", write(dir, "a", "s3cret\n")), "s3cret");
  EXPECT_EQ(read_secret_file("w", write(dir, "b", "s3cret\r\n")), "s3cret");
  EXPECT_EQ(read_secret_file("w", write(dir, "c", "s3cret")), "s3cret");
  EXPECT_EQ(read_secret_file("w", write(dir, "d", "two\n\n")), "two\n");
  EXPECT_EQ(read_secret_file("w", write(dir, "e", " spaced ")), " spaced ");
}

TEST(Secret, BadFilesNameTheFileNeverTheContent) {
  idem::test::TempDir dir;
  const std::string missing = (dir.path() / "missing").string();
  EXPECT_NE(config_error_of([&] { (void)read_secret_file("opt_file", missing); }).find(missing),
            std::string::npos);
  EXPECT_NE(config_error_of([&] {
              (void)read_secret_file("w", write(dir, "empty", "\n"));
            }).find("empty"),
            std::string::npos);
  const std::string nul = write(dir, "nul", std::string("abc\0hidden-part", 15));
  const std::string message = config_error_of([&] { (void)read_secret_file("w", nul); });
  EXPECT_NE(message.find("NUL"), std::string::npos);
  EXPECT_EQ(message.find("hidden-part"), std::string::npos) << message;
}

TEST(Secret, EnvironmentVariable) {
  ::setenv("IDEM_SECRET_TEST_VALUE", "from-env", 1);
  EXPECT_EQ(read_secret_env("w", "IDEM_SECRET_TEST_VALUE"), "from-env");
  ::setenv("IDEM_SECRET_TEST_EMPTY", "", 1);
  EXPECT_NE(config_error_of([] {
              (void)read_secret_env("w", "IDEM_SECRET_TEST_EMPTY");
            }).find("IDEM_SECRET_TEST_EMPTY"),
            std::string::npos);
  ::unsetenv("IDEM_SECRET_TEST_UNSET");
  EXPECT_THROW((void)read_secret_env("w", "IDEM_SECRET_TEST_UNSET"), idem::ConfigError);
  ::unsetenv("IDEM_SECRET_TEST_VALUE");
  ::unsetenv("IDEM_SECRET_TEST_EMPTY");
}

TEST(Secret, OneSourceAtMost) {
  idem::test::TempDir dir;
  const std::string file = write(dir, "pw", "from-file\n");
  ::setenv("IDEM_SECRET_TEST_ONE", "from-env", 1);
  EXPECT_EQ(resolve_secret("opt", "", "", ""), std::nullopt);
  EXPECT_EQ(resolve_secret("opt", "inline", "", ""), "inline");
  EXPECT_EQ(resolve_secret("opt", "", file, ""), "from-file");
  EXPECT_EQ(resolve_secret("opt", "", "", "IDEM_SECRET_TEST_ONE"), "from-env");
  const std::string message =
      config_error_of([&] { (void)resolve_secret("opt", "inline-pw", file, ""); });
  EXPECT_NE(message.find("one way only"), std::string::npos) << message;
  EXPECT_EQ(message.find("inline-pw"), std::string::npos) << message;
  EXPECT_THROW((void)resolve_secret("opt", "", file, "IDEM_SECRET_TEST_ONE"), idem::ConfigError);
  ::unsetenv("IDEM_SECRET_TEST_ONE");
}

TEST(Secret, RedactUrlHidesSslPassword) {
  EXPECT_EQ(idem::redact_url("postgresql://u@h/db?sslkey=/k&sslpassword=keypw&a=1"),
            "postgresql://u@h/db?sslkey=/k&sslpassword=***&a=1");
  EXPECT_EQ(idem::redact_url("postgresql://u@h/db?password_file=/run/pw"),
            "postgresql://u@h/db?password_file=/run/pw");
}

}  // namespace
