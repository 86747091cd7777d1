// Helpers of the Redis failover tests (redis_cluster_env.hpp, redis_sentinel_env.hpp): the
// servers scripts/servers.sh starts, asked one by one outside idem's routing, a bounded wait for
// a condition, and the ids of a batch.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../server_env.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "redis_names.hpp"

namespace idem::test::redis_nodes {

using namespace idem::test::redis_names;
using Clock = std::chrono::steady_clock;

// The ports an environment variable lists ("P1 P2 ...").
inline std::vector<int> ports_of(const char* variable) {
  std::istringstream text(idem::test::env(variable));
  std::vector<int> out;
  int port = 0;
  while (text >> port)
    out.push_back(port);
  return out;
}

// One command to one server on 127.0.0.1 (a data node or a sentinel); nullopt when it does not
// answer.
inline std::optional<idem::redis::RedisReply> ask(int port,
                                                  std::initializer_list<std::string_view> args) {
  try {
    RedisOptions options;
    options.port = port;
    options.connect_timeout = 500ms;
    options.command_timeout = 2s;
    ConnectionPool pool(options);
    auto connection = pool.lease();
    return connection->command(args, CommandKind::read);
  } catch (const RedisError&) {
    return std::nullopt;
  }
}

// INFO `section` of the server at `port` holds `text`.
inline bool info_has(int port, const char* section, const std::string& text) {
  const auto info = ask(port, {"INFO", section});
  return info && info->str.find(text) != std::string::npos;
}

// Polls `condition` every 100 ms until it holds or `limit` passes; whether it held.
inline bool poll_until(const std::function<bool()>& condition, std::chrono::seconds limit = 30s) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return condition();
}

// Subscribers of `channel` on the server at `port` (PUBSUB NUMSUB; SHARDNUMSUB for a cluster
// node's sharded channels); -1 when it does not answer.
inline long long subscribers(int port, const std::string& channel, bool sharded) {
  const auto reply = ask(port, {"PUBSUB", sharded ? "SHARDNUMSUB" : "NUMSUB", channel});
  return reply && reply->elements.size() == 2 ? reply->elements[1].integer : -1;
}

// "<tag>-0" ... "<tag>-<n-1>".
inline std::vector<std::string> ids(const std::string& tag, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tag + "-" + std::to_string(i));
  return out;
}

}  // namespace idem::test::redis_nodes
