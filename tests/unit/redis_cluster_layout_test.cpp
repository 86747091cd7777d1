// The cluster layout idem reads from CLUSTER SHARDS (backends/redis/src/cluster.hpp, not
// installed): every node lists the shards in an order of its own, and a layout read from any of
// them must number the primaries the same way — a list() cursor names a primary by its index, and
// a layout read again from another node must not move a cursor to another primary.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "../../backends/redis/src/cluster.hpp"

namespace {

using idem::redis::RedisReply;

RedisReply text(std::string value) {
  RedisReply reply;
  reply.type = RedisReply::Type::string;
  reply.str = std::move(value);
  return reply;
}

RedisReply number(long long value) {
  RedisReply reply;
  reply.type = RedisReply::Type::integer;
  reply.integer = value;
  return reply;
}

RedisReply array(std::vector<RedisReply> elements) {
  RedisReply reply;
  reply.type = RedisReply::Type::array;
  reply.elements = std::move(elements);
  return reply;
}

// One shard of CLUSTER SHARDS (RESP2: maps are flat arrays): slots [first, last], served by a
// primary on 127.0.0.1:port, with a replica on port + 100.
RedisReply shard(int first, int last, int port) {
  const auto node = [](int p, const char* role) {
    return array({text("id"), text("node-" + std::to_string(p)), text("port"), number(p),
                  text("ip"), text("127.0.0.1"), text("endpoint"), text("127.0.0.1"), text("role"),
                  text(role), text("health"), text("online")});
  };
  return array({text("slots"), array({number(first), number(last)}), text("nodes"),
                array({node(port + 100, "replica"), node(port, "master")})});
}

TEST(RedisClusterLayout, EveryNodesOrderOfShardsGivesTheSameNumbering) {
  const auto a = shard(0, 5460, 7002);
  const auto b = shard(5461, 10922, 7000);
  const auto c = shard(10923, 16383, 7001);
  const auto one = idem::redis::detail::parse_shards(array({a, b, c}), false, "node A");
  const auto other = idem::redis::detail::parse_shards(array({c, a, b}), false, "node B");
  ASSERT_EQ(one->primaries.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(one->primaries[i].name, other->primaries[i].name) << i;
  EXPECT_EQ(one->slots, other->slots);
  EXPECT_EQ(one->node_for(0)->port, 7002);
  EXPECT_EQ(one->node_for(5461)->port, 7000);
  EXPECT_EQ(one->node_for(16383)->port, 7001);
  EXPECT_EQ(one->primaries.front().name, "127.0.0.1:7000");  // in name order
}

}  // namespace
