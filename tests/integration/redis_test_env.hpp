// Shared by idem's Redis tests: where the server is, and a private key prefix per test.
//
// Tests find the server in IDEM_TEST_REDIS_URL (scripts/servers.sh exports it). When it is
// missing, every test of the binary is skipped with a message naming the variable — or, when
// IDEM_REQUIRE_SERVERS=1 (the test command sets it), the binary fails: in CI a missing server is
// an error, not a skip. A test binary opts in with IDEM_REDIS_TEST_ENVIRONMENT() at namespace
// scope.
//
// RedisTestPrefix gives each test a unique key prefix ("idemtest:<pid>:<n>:<random>:") and
// deletes every key under it when destroyed, so tests never see each other's keys and leave
// nothing behind.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../server_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::test {

inline std::string redis_url() {
  return env("IDEM_TEST_REDIS_URL");
}

}  // namespace idem::test

#define IDEM_REDIS_TEST_ENVIRONMENT()                                                              \
  IDEM_SERVER_TEST_ENVIRONMENT(idem_redis_test_environment, "IDEM_TEST_REDIS_URL", "Redis server", \
                               "redis://127.0.0.1:PORT/0")

// The same for the binaries of the Cluster tests (IDEM_TEST_REDIS_CLUSTER_URL) and of the Sentinel
// group's (IDEM_TEST_REDIS_SENTINEL_URL).
#define IDEM_REDIS_CLUSTER_TEST_ENVIRONMENT()                                            \
  IDEM_SERVER_TEST_ENVIRONMENT(redis_cluster_environment, "IDEM_TEST_REDIS_CLUSTER_URL", \
                               "Redis Cluster", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/0")
#define IDEM_REDIS_SENTINEL_TEST_ENVIRONMENT()                                             \
  IDEM_SERVER_TEST_ENVIRONMENT(redis_sentinel_environment, "IDEM_TEST_REDIS_SENTINEL_URL", \
                               "Redis Sentinel group",                                     \
                               "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/idem")

namespace idem::test {

// Options for the test server with `prefix` (and `clock`, when given).
inline redis::RedisOptions redis_test_options(std::string prefix,
                                              std::shared_ptr<Clock> clock = nullptr) {
  redis::RedisOptions options = redis::RedisOptions::from_url(redis_url());
  options.key_prefix = std::move(prefix);
  options.clock = std::move(clock);
  return options;
}

// A key prefix of this test's own on a server thrown away with the run (nothing is deleted):
// "idemtest:<pid>:<n>:<name>:".
inline std::string redis_url_test_prefix(std::string_view name) {
  static std::atomic<int> counter{0};
  return "idemtest:" + std::to_string(::getpid()) + ":" + std::to_string(counter++) + ":" +
         std::string(name) + ":";
}

// Options for the Redis that the URL in `url_variable` names (IDEM_TEST_REDIS_CLUSTER_URL,
// IDEM_TEST_REDIS_SENTINEL_URL) under redis_url_test_prefix(name), with `clock` when given.
inline redis::RedisOptions redis_url_test_options(const char* url_variable, std::string_view name,
                                                  std::shared_ptr<Clock> clock = nullptr) {
  redis::RedisOptions options = redis::RedisOptions::from_url(env(url_variable));
  options.key_prefix = redis_url_test_prefix(name);
  options.clock = std::move(clock);
  return options;
}

// ACL SETUSER for the least-privilege application user of docs/security.md ("Redis"), with
// `prefix` in place of "idem:".
inline std::vector<std::string> redis_app_acl_rule(const std::string& user,
                                                   const std::string& password,
                                                   const std::string& prefix) {
  return {"ACL",
          "SETUSER",
          user,
          "reset",
          "on",
          ">" + password,
          "~" + prefix + "*",
          "resetchannels",
          "-@all",
          "+ping",
          "+select",
          "+get",
          "+getrange",
          "+set",
          "+exists",
          "+hget",
          "+hmget",
          "+scan",
          "+eval",
          "+evalsha",
          "+script|load",
          "+del",
          "+hgetall",
          "+hset",
          "+incr",
          "+pexpireat"};
}

class RedisTestPrefix {
 public:
  explicit RedisTestPrefix(std::string_view name = "t") {
    static std::atomic<int> counter{0};
    std::random_device device;
    prefix_ = "idemtest:" + std::to_string(::getpid()) + ":" + std::to_string(counter++) + ":" +
              std::to_string(device() % 1000000) + ":" + std::string(name) + ":";
    pool_ = std::make_shared<redis::ConnectionPool>(redis_test_options(prefix_));
  }
  RedisTestPrefix(const RedisTestPrefix&) = delete;
  RedisTestPrefix& operator=(const RedisTestPrefix&) = delete;
  ~RedisTestPrefix() {
    try {
      delete_all();
    } catch (...) {
      // The server may be gone (fault tests); nothing else to clean then.
    }
  }

  const std::string& prefix() const { return prefix_; }
  redis::RedisOptions options(std::shared_ptr<Clock> clock = nullptr) const {
    return redis_test_options(prefix_, std::move(clock));
  }

  // A raw command on the test server (outside idem's API: to inspect or damage records).
  redis::RedisReply command(std::initializer_list<std::string_view> args) const {
    auto connection = pool_->lease();
    return connection->command(args);
  }

  redis::RedisReply command(const std::vector<std::string>& args) const {
    const std::vector<std::string_view> views(args.begin(), args.end());
    auto connection = pool_->lease();
    return connection->command(std::span<const std::string_view>(views));
  }

  // How many keys live under the prefix.
  std::size_t key_count() const { return keys().size(); }

  std::vector<std::string> keys() const {
    auto connection = pool_->lease();
    std::vector<std::string> found;
    std::string cursor = "0";
    const std::string pattern = glob_escaped(prefix_) + "*";
    do {
      const auto page = connection->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      cursor = page.elements.at(0).str;
      for (const auto& key : page.elements.at(1).elements)
        found.push_back(key.str);
    } while (cursor != "0");
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
    return found;
  }

  void delete_all() const {
    const auto all = keys();
    auto connection = pool_->lease();
    for (const auto& key : all)
      connection->append({"UNLINK", key});
    if (!all.empty()) connection->read_replies();
  }

 private:
  static std::string glob_escaped(std::string_view text) {
    std::string out;
    for (char c : text) {
      if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
      out += c;
    }
    return out;
  }

  std::string prefix_;
  std::shared_ptr<redis::ConnectionPool> pool_;
};

}  // namespace idem::test
