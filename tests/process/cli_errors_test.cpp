// What `idem` says when it cannot reach a store or a broker, run as a process (IDEM_CLI) against
// real endpoints: a name that does not resolve, a closed port, a port where an HTTP server
// answers, a port where a listener never answers, a directory where a SQLite file should be.
// Each is its own message and error code, marked retryable only where trying again may help;
// messages name the URL's parts in the URL's words (no function or options struct of the
// library) and echo the URL as the user wrote it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../free_port.hpp"
#include "../temp_dir.hpp"
#include "demo_cli.hpp"

namespace {

using idem::test::CliRun;
using idem::test::has;
using idem::test::HttpListener;
using idem::test::run_cli;

// The backends and transports this idem was built with, from --version.
bool built(const std::string& part) {
  return has(run_cli({"--version"}), part);
}

// One error line: exit 3, the code right after the command's prefix, "(retryable)" as given.
void expect_error(const CliRun& run, const std::string& prefix, const std::string& code,
                  bool retryable, const std::string& says) {
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_EQ(run.output.rfind(prefix + code + ": ", 0), 0u) << run.output;
  EXPECT_EQ(has(run, "(retryable)"), retryable) << run.output;
  EXPECT_TRUE(has(run, says)) << "expected '" << says << "' in: " << run.output;
}

std::string port_of(int port) {
  return std::to_string(port);
}

TEST(CliErrors, Redis) {
  IDEM_REQUIRE_CLI();
  if (!built("redis")) GTEST_SKIP() << "built without Redis";
  const CliRun unresolved = run_cli({"stats", "redis://nohost.invalid:6379"});
  // A resolver that cannot be reached says "Temporary failure": retryable then, not otherwise.
  expect_error(unresolved, "idem stats: ", "host_not_found", has(unresolved, "Temporary failure"),
               "cannot resolve host 'nohost.invalid'");
  EXPECT_FALSE(has(unresolved, "No route to host")) << unresolved.output;

  const int closed = idem::test::unused_loopback_port();
  expect_error(run_cli({"stats", "redis://127.0.0.1:" + port_of(closed)}),
               "idem stats: ", "connection_refused", true, "Connection refused");

  const HttpListener http;
  const CliRun web = run_cli({"stats", "redis://127.0.0.1:" + port_of(http.port())});
  expect_error(web, "idem stats: ", "wrong_protocol", false, "is this a Redis port?");
  EXPECT_TRUE(has(web, "does not speak the Redis protocol (its first reply begins 'HTTP/1.1"))
      << web.output;

  const idem::test::LoopbackListener silent(16);
  expect_error(
      run_cli({"stats", "redis://127.0.0.1:" + port_of(silent.port()) + "?command_timeout=300ms"}),
      "idem stats: ", "connect_timeout", true, "is this a Redis port?");
}

TEST(CliErrors, PostgreSql) {
  IDEM_REQUIRE_CLI();
  if (!built("postgres")) GTEST_SKIP() << "built without PostgreSQL";
  const CliRun unresolved = run_cli({"stats", "postgresql://app:hunter2@nohost.invalid/orders"});
  expect_error(unresolved, "idem stats: ", "host_not_found", has(unresolved, "Temporary failure"),
               "nohost.invalid");

  const int closed = idem::test::unused_loopback_port();
  const CliRun refused =
      run_cli({"stats", "postgresql://app:hunter2@127.0.0.1:" + port_of(closed) + "/orders"});
  expect_error(refused, "idem stats: ", "connection_refused", true, "Connection refused");
  EXPECT_FALSE(has(refused, "hunter2")) << refused.output;

  const HttpListener http;
  expect_error(run_cli({"stats", "postgresql://app@127.0.0.1:" + port_of(http.port()) + "/db"}),
               "idem stats: ", "wrong_protocol", false, "is this a PostgreSQL port?");

  const idem::test::LoopbackListener silent(16);
  const CliRun quiet = run_cli({"stats", "postgresql://app@127.0.0.1:" + port_of(silent.port()) +
                                             "/db?connect_timeout=300ms"});
  expect_error(quiet, "idem stats: ", "connect_timeout", true, "is this a PostgreSQL port?");
  EXPECT_TRUE(has(quiet, "within 300 ms (connect_timeout)")) << quiet.output;
  EXPECT_FALSE(has(quiet, "PostgresOptions")) << quiet.output;
}

TEST(CliErrors, RabbitMqBrokerErrorsAreBrokerErrors) {
  IDEM_REQUIRE_CLI();
  if (!built("rabbitmq") || !built("sqlite")) GTEST_SKIP() << "built without RabbitMQ or SQLite";
  const idem::test::TempDir dir;
  const std::string store = "sqlite://" + dir.file("relay.db");
  const auto relay = [&](const std::string& broker) {
    return run_cli({"relay", "--once", "--store", store, "--broker", broker});
  };
  const CliRun unresolved = relay("amqp://guest:secret@nohost.invalid:5672/");
  expect_error(unresolved, "idem relay: ", "host_not_found", has(unresolved, "Temporary failure"),
               "cannot resolve host 'nohost.invalid'");

  const int closed = idem::test::unused_loopback_port();
  const CliRun refused = relay("amqp://guest:secret@127.0.0.1:" + port_of(closed) + "/");
  expect_error(refused, "idem relay: ", "connection_refused", true,
               "connection refused: nothing listens at 127.0.0.1:" + port_of(closed));
  EXPECT_FALSE(has(refused, "a socket error occurred")) << refused.output;
  EXPECT_FALSE(has(refused, "secret")) << refused.output;

  const HttpListener http;
  const CliRun web = relay("amqp://guest:secret@127.0.0.1:" + port_of(http.port()) + "/");
  expect_error(web, "idem relay: ", "wrong_protocol", false, "does not speak AMQP");
  EXPECT_FALSE(has(web, "password")) << "a web server is not a refused login: " << web.output;

  const idem::test::LoopbackListener silent(16);
  const CliRun quiet = relay("amqp://guest:secret@127.0.0.1:" + port_of(silent.port()) + "/");
  expect_error(quiet, "idem relay: ", "connect_timeout", true,
               "did not answer the AMQP protocol header");
  EXPECT_FALSE(has(quiet, "password")) << quiet.output;
}

TEST(CliErrors, SqliteDirectory) {
  IDEM_REQUIRE_CLI();
  if (!built("sqlite")) GTEST_SKIP() << "built without SQLite";
  const idem::test::TempDir dir;
  const CliRun run = run_cli({"stats", "sqlite://" + dir.path().string()});
  expect_error(run, "idem stats: ", "store_open_failed", false, "it is a directory");
  EXPECT_FALSE(has(run, "disk I/O error")) << run.output;
}

// Messages about a URL name its parts as the user wrote them: no library function or options
// struct, no parameter the command added, the same list of schemes wherever one is expected.
TEST(CliErrors, UrlMessagesUseTheUsersWords) {
  IDEM_REQUIRE_CLI();
  const CliRun missing = run_cli({"stats", "garbage"});
  const CliRun unknown = run_cli({"stats", "nosuch://x"});
  const std::string schemes =
      "(expected memory, sqlite, redis, rediss, redis+cluster, rediss+cluster, redis+sentinel, "
      "rediss+sentinel, postgresql or postgres)";
  for (const CliRun& run : {missing, unknown}) {
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_TRUE(has(run, schemes)) << run.output;
    EXPECT_FALSE(has(run, "open_recorder") || has(run, "open_store")) << run.output;
  }
  if (built("sqlite")) {
    const CliRun empty = run_cli({"stats", "sqlite:"});
    EXPECT_EQ(empty.output,
              "idem stats: config_error: path: is missing (sqlite:///absolute/path.db, "
              "sqlite:relative/path.db or sqlite::memory:) (URL 'sqlite:')\n");
  }
  if (built("postgres")) {
    const CliRun bogus = run_cli({"stats", "postgresql://u:secret@127.0.0.1:1/db?bogus=1"});
    EXPECT_EQ(bogus.exit_code, 2) << bogus.output;
    EXPECT_FALSE(has(bogus, "PostgresOptions")) << bogus.output;
    EXPECT_FALSE(has(bogus, "create_schema")) << bogus.output;
    EXPECT_FALSE(has(bogus, "secret")) << bogus.output;
    EXPECT_TRUE(has(bogus, "(URL 'postgresql://u:***@127.0.0.1:1/db?bogus=1')")) << bogus.output;
  }
}

}  // namespace
