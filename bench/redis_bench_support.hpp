// What the Redis benchmarks share: the server's URL, and deleting what a run wrote.
#pragma once

#include <cstdlib>
#include <string>

#include "bench_flags.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::bench {

// The URL from --url (taken out of argv), else IDEM_BENCH_REDIS_URL, else IDEM_TEST_REDIS_URL;
// "" when none is given.
inline std::string take_redis_url(int& argc, char** argv) {
  std::string url = take_flag(argc, argv, "url");
  for (const char* variable : {"IDEM_BENCH_REDIS_URL", "IDEM_TEST_REDIS_URL"}) {
    if (url.empty() && std::getenv(variable) != nullptr) url = std::getenv(variable);
  }
  return url;
}

// UNLINKs every key under options.key_prefix (the run's own "idem-bench:<pid>:").
inline void delete_keys_under_prefix(const idem::redis::RedisOptions& options) {
  idem::redis::ConnectionPool pool(options);
  auto connection = pool.lease();
  std::string cursor = "0";
  const std::string pattern = options.key_prefix + "*";
  do {
    const auto page = connection->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "10000"});
    cursor = page.elements.at(0).str;
    for (const auto& key : page.elements.at(1).elements)
      connection->append({"UNLINK", key.str});
    if (connection->pending() > 0) (void)connection->read_replies();
  } while (cursor != "0");
}

}  // namespace idem::bench
