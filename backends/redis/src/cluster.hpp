// Redis Cluster on the blocking face (not installed). A cluster splits the keyspace into 16384
// slots, each served by one primary; a client sends each command to the primary of its key's slot
// and follows the cluster's redirections when the layout changes under it (the Redis Cluster
// specification: MOVED, ASK, TRYAGAIN, CLUSTERDOWN).
//
// Two parts:
//  * ClusterMap, one per ConnectionPool: the layout (which primary serves which slot), read with
//    CLUSTER SHARDS from any node that answers and read again when a redirection or a dead node
//    says it changed. Thread-safe; layouts are immutable snapshots.
//  * ClusterRouting, one per pooled RedisConnection on a cluster: a connection to each node it has
//    needed (opened on first use, kept while it works) and the routing of one caller's commands
//    and pipelines to them. As single-threaded as the lease it belongs to.
//
// Every key of one record (a recorder's marker and claim, a store record) carries one hash tag,
// so every command and script idem sends touches one slot, and a pipeline splits by node.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"
#include "internal.hpp"

namespace idem::net {
class TlsContext;
}

namespace idem::redis::detail {

constexpr std::size_t kClusterSlots = 16384;

// The slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between the first '{' and the next
// '}' when that is not empty) or of the whole key, modulo 16384.
std::uint16_t key_slot(std::string_view key) noexcept;

// The key a command is routed by: the first KEYS entry of EVAL/EVALSHA, else args[1] (every
// keyed command idem sends has its key there); nullopt for a command without a key (PING,
// SCRIPT, SCAN, an EVAL with no keys).
std::optional<std::string_view> routing_key(std::span<const std::string_view> args) noexcept;

// A redirection in an error reply: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
struct Redirection {
  bool ask = false;  // ASK: this one command goes to `host:port`; the layout did not change
  std::uint16_t slot = 0;
  std::string host;  // empty: the node that answered (Redis sends ":port" when it has no name)
  int port = 0;
};
std::optional<Redirection> parse_redirection(std::string_view error);

// "host:port" ([host]:port for an IPv6 address): a node's name in layouts and messages.
std::string node_name(const std::string& host, int port);

struct ClusterNode {
  std::string host;
  int port = 0;
  std::string name;  // node_name(host, port)
};

// The layout at one moment: the primaries and the slot → primary table.
struct ClusterLayout {
  static constexpr std::uint16_t kNone = 0xffff;
  std::vector<ClusterNode> primaries;
  std::array<std::uint16_t, kClusterSlots> slots{};  // an index into primaries, or kNone
  std::chrono::steady_clock::time_point loaded{};

  const ClusterNode* node_for(std::uint16_t slot) const noexcept {
    const std::uint16_t i = slots[slot];
    return i == kNone ? nullptr : &primaries[i];
  }
};

// A CLUSTER SHARDS reply as a layout: each shard's primary (its "master" node; its TLS port
// with `tls`) serves the shard's slot ranges. Throws RedisError (protocol) on another shape.
std::shared_ptr<ClusterLayout> parse_shards(const RedisReply& reply, bool tls,
                                            const std::string& endpoint);

// ---- shared by both faces' routing (ClusterRouting here, AsyncCluster in async_cluster.cpp) ----

// Redirections one command follows at most between two pauses (a layout that keeps changing).
constexpr int kMaxRedirections = 16;

// TRYAGAIN (a slot in migration, keys split) or CLUSTERDOWN: send again after a pause.
bool is_retry_later(const RedisReply& reply);

// The redirection in `reply` that the command must follow (its host filled in from `node` when
// Redis left it out), counting it in `redirections`; nullopt when the reply is no redirection or
// the count is over kMaxRedirections.
std::optional<Redirection> redirection_to_follow(const RedisReply& reply, const ClusterNode& node,
                                                 int& redirections);

// The nodes a layout is read from, in order: the primaries of `known` (the cluster as it was),
// then the configured nodes (the way in when every known primary has gone).
std::vector<std::pair<std::string, int>> layout_sources(const ClusterLayout* known,
                                                        const RedisOptions& options);

// A failure to read the layout that is a configuration error (not a cluster node, credentials or
// TLS refused): reported at once when no layout is known yet.
bool is_layout_refusal(const RedisError& error) noexcept;

// No node answered and no layout is known: the first failure, or that no node is configured.
[[noreturn]] void throw_no_layout(const std::optional<RedisError>& first_failure,
                                  const std::string& endpoint);

// `base` (null: an empty layout) with `slot` served by host:port, the primary added when new.
std::shared_ptr<ClusterLayout> with_slot_moved(const ClusterLayout* base, std::uint16_t slot,
                                               const std::string& host, int port);

class ClusterMap {
 public:
  ClusterMap(const RedisOptions& options, std::shared_ptr<const net::TlsContext> tls);

  // The current layout, loaded on first use. Throws RedisError (connect) when no node answers.
  std::shared_ptr<const ClusterLayout> layout();
  // Reads the layout again — unless another thread already replaced `seen`, or it was read in the
  // last few milliseconds (many callers meeting one dead node reload it once) — asking the known
  // primaries, then the configured nodes. Returns the newest layout; throws when no node answers
  // and no layout is known.
  std::shared_ptr<const ClusterLayout> reload(const std::shared_ptr<const ClusterLayout>& seen);
  // MOVED: `slot` is served by host:port now. Updates the one slot (a full reload follows when
  // the last one is old enough, since a failover or a resharding moves many slots at once).
  std::shared_ptr<const ClusterLayout> moved(const std::shared_ptr<const ClusterLayout>& seen,
                                             std::uint16_t slot, const std::string& host, int port);

  // A connection to one node, with every option of the pool (credentials, TLS, timeouts).
  std::unique_ptr<RedisConnection> connect(const std::string& host, int port) const;
  const RedisOptions& options() const noexcept { return options_; }

 private:
  std::shared_ptr<const ClusterLayout> load(const std::shared_ptr<const ClusterLayout>& known);
  std::shared_ptr<const ClusterLayout> current() const;
  void publish(std::shared_ptr<const ClusterLayout> layout);

  const RedisOptions options_;
  const std::shared_ptr<const net::TlsContext> tls_;
  mutable std::mutex mutex_;  // guards current_ (held briefly)
  std::shared_ptr<const ClusterLayout> current_;
  std::mutex reload_mutex_;  // one reload at a time (held across its round trips)
};

class ClusterRouting {
 public:
  // Loads the layout if the map has none yet (throws RedisError when no node answers).
  explicit ClusterRouting(std::shared_ptr<ClusterMap> map);
  ~ClusterRouting();
  ClusterRouting(const ClusterRouting&) = delete;
  ClusterRouting& operator=(const ClusterRouting&) = delete;

  // RedisConnection's calls, routed. A command goes to its key's primary; MOVED updates the
  // layout and sends it again, ASK sends it once to the named node after ASKING, TRYAGAIN and
  // CLUSTERDOWN wait and send it again, and a node that cannot be reached makes the layout be
  // read again: all within command_timeout, after which the last error reply is returned (or the
  // last failure thrown). A command whose reply was lost is never sent again (in doubt, thrown).
  RedisReply command(std::span<const std::string_view> args, CommandKind kind,
                     std::string_view what);
  void append(std::span<const std::string_view> args);
  // Sends the queued commands to their nodes (one write each), then reads every node's replies;
  // a command redirected or refused for now is then sent again on its own, as command() does.
  // Replies in the order the commands were queued.
  std::vector<RedisReply> read_replies(CommandKind kind, std::string_view what);
  std::size_t pending() const noexcept;
  bool broken() const noexcept { return broken_; }
  const std::string& endpoint() const noexcept { return endpoint_; }
  // The node connection the last routed command went to (null before the first): where a
  // subscription made with command() receives its messages.
  RedisConnection* last_node() const noexcept { return last_; }
  // The pool hands the set out again: each node connection is checked for a hang-up when the
  // lease first uses it (link()). True only when the set is broken.
  bool looks_dead() noexcept;
  // Reads the layout again and returns its primaries: SCAN and SCRIPT LOAD run on each, through
  // link(). Valid until the next call.
  const std::vector<ClusterNode>& primaries();
  // The connection to `node`, opened when there is none (throws RedisError when it cannot be).
  RedisConnection& link(const ClusterNode& node);

 private:
  friend struct ConnectionAccess;
  using Clock = std::chrono::steady_clock;
  void drop(const std::string& name) noexcept;
  RedisReply keyless(std::span<const std::string_view> args, CommandKind kind,
                     std::string_view what);

  std::shared_ptr<ClusterMap> map_;
  std::shared_ptr<const ClusterLayout> layout_;
  std::map<std::string, std::unique_ptr<RedisConnection>, std::less<>> links_;
  std::vector<std::vector<std::string>> queued_;
  std::vector<ClusterNode> primaries_;  // of the last primaries()
  std::string endpoint_;
  RedisConnection* last_ = nullptr;             // one of links_, or null
  std::set<std::string, std::less<>> checked_;  // links checked for a hang-up in this lease
  bool broken_ = false;
};

}  // namespace idem::redis::detail
