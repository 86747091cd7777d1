// Helpers of the Sentinel failover tests: the group scripts/servers.sh starts with
// IDEM_TEST_REDIS_SENTINEL=1 (a primary, its replica and three sentinels monitoring it as
// "idem"), asked directly, and a bounded wait until it is whole again after a failover.
#pragma once

#include <string>

#include "redis_nodes_env.hpp"

namespace idem::test::sentinel {

using namespace idem::test::redis_nodes;

// The port the first sentinel that answers names as the primary; 0 when none answers.
inline int named_primary() {
  for (int sentinel : ports_of("IDEM_TEST_REDIS_SENTINEL_PORTS")) {
    const auto reply = ask(sentinel, {"SENTINEL", "get-master-addr-by-name", "idem"});
    if (reply && reply->elements.size() == 2) return std::stoi(reply->elements[1].str);
  }
  return 0;
}

// The sentinels name a primary other than `old_primary`.
inline bool switched_from(int old_primary) {
  const int now = named_primary();
  return now != 0 && now != old_primary;
}

// Every sentinel names one primary that answers ROLE master, sees its replica in sync and knows
// the other two sentinels.
inline bool group_whole() {
  int primary = 0;
  for (int sentinel : ports_of("IDEM_TEST_REDIS_SENTINEL_PORTS")) {
    const auto address = ask(sentinel, {"SENTINEL", "get-master-addr-by-name", "idem"});
    if (!address || address->elements.size() != 2) return false;
    const int port = std::stoi(address->elements[1].str);
    if (primary != 0 && port != primary) return false;
    primary = port;
    const auto replicas = ask(sentinel, {"SENTINEL", "replicas", "idem"});
    if (!replicas || replicas->elements.size() != 1) return false;
    const auto& fields = replicas->elements[0].elements;
    bool link_ok = false;
    bool plain_replica = false;
    for (std::size_t i = 0; i + 1 < fields.size(); i += 2) {
      if (fields[i].str == "master-link-status") link_ok = fields[i + 1].str == "ok";
      if (fields[i].str == "flags") plain_replica = fields[i + 1].str == "slave";
    }
    if (!link_ok || !plain_replica) return false;
  }
  const auto role = ask(primary, {"ROLE"});
  return role && !role->elements.empty() && role->elements[0].str == "master";
}

}  // namespace idem::test::sentinel
