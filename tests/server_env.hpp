// Where the test servers are, for every test that needs one. scripts/servers.sh starts Redis,
// PostgreSQL and RabbitMQ on free ports and exports where they are (IDEM_TEST_REDIS_URL,
// IDEM_TEST_POSTGRES_URL, IDEM_TEST_AMQP_URL, the TLS ports and certificate directory, the
// server-control commands) and IDEM_REQUIRE_SERVERS=1. A test without what it needs is skipped
// with a message naming it — or fails when IDEM_REQUIRE_SERVERS=1: in CI a missing server is an
// error, not a skip.
//
// Thread-safety: env() reads the environment (do not setenv while tests run).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace idem::test {

// The value of the environment variable `name`, "" when it is unset.
inline std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

// IDEM_REQUIRE_SERVERS=1: a missing server fails the test instead of skipping it.
inline bool servers_required() {
  return env("IDEM_REQUIRE_SERVERS") == "1";
}

}  // namespace idem::test

// In a test body or SetUp: skips the test because `message` (a stream expression: "no Redis TLS
// listener", "redis-server is not installed") is missing — or fails it when servers are
// required. Returns from the function either way.
#define IDEM_SERVER_MISSING(message)                                             \
  do {                                                                           \
    if (::idem::test::servers_required()) {                                      \
      FAIL() << message << " but IDEM_REQUIRE_SERVERS=1: run the tests through " \
             << "scripts/servers.sh (or scripts/test.sh)";                       \
    }                                                                            \
    GTEST_SKIP() << message << ": run the tests through scripts/servers.sh";     \
  } while (false)

namespace idem::test {

// Skips (or fails) every test of a binary whose server variable is unset. A test binary
// registers one per server with IDEM_SERVER_TEST_ENVIRONMENT(...) at namespace scope (or a
// backend's own macro: IDEM_REDIS_TEST_ENVIRONMENT(), IDEM_POSTGRES_TEST_ENVIRONMENT(),
// IDEM_RABBITMQ_TEST_ENVIRONMENT()).
class ServerEnvironment : public ::testing::Environment {
 public:
  // `variable`: where the server is; `server`: what it is, for the message ("Redis server");
  // `example`: a value that would do.
  ServerEnvironment(const char* variable, const char* server, const char* example)
      : variable_(variable), server_(server), example_(example) {}

  void SetUp() override {
    if (!env(variable_).empty()) return;
    IDEM_SERVER_MISSING("no " << server_ << ": " << variable_ << " is not set (e.g. " << variable_
                              << "=" << example_ << ")");
  }

 private:
  const char* variable_;
  const char* server_;
  const char* example_;
};

}  // namespace idem::test

#define IDEM_SERVER_ENV_CONCAT_(a, b) a##b
#define IDEM_SERVER_ENV_CONCAT(a, b) IDEM_SERVER_ENV_CONCAT_(a, b)
// (__COUNTER__ keeps the name unique when a unity build compiles several test files as one.)
#define IDEM_SERVER_TEST_ENVIRONMENT(name, variable, server, example)                         \
  [[maybe_unused]] static ::testing::Environment* const IDEM_SERVER_ENV_CONCAT(name,          \
                                                                               __COUNTER__) = \
      ::testing::AddGlobalTestEnvironment(                                                    \
          new ::idem::test::ServerEnvironment(variable, server, example))
