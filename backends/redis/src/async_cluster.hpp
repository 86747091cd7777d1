// Redis Cluster on the coroutine face (not installed): the router behind an AsyncConnection made
// with a redis+cluster:// URL. The blocking face's pieces that are pure data are shared
// (cluster.hpp: key_slot, routing_key, parse_redirection, parse_shards, ClusterLayout); the I/O
// is coroutines over one pipelined AsyncConnection per primary, opened on first use.
//
// run() splits a call's commands by their key's slot, sends each primary its part at once (one
// pipelined write each, the round trips overlapping), and puts the replies back in the caller's
// order. A command answered with MOVED
// (the layout is updated), ASK (sent once more after ASKING to the named node), TRYAGAIN or
// CLUSTERDOWN (sent again after a pause, the layout read again) is sent on its own, within
// command_timeout from the call's start; a command whose reply was lost is never sent again.
// Thread-safe: calls may run on any threads at once (the layout and the node table are guarded).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cluster.hpp"
#include "idem/async/task.hpp"
#include "idem/redis/async_connection.hpp"

namespace idem::redis::detail {

// Adds the counts of `more` to `total`: the stats of a pool or of a cluster are the sums over its
// connections.
void add_stats(AsyncConnectionStats& total, const AsyncConnectionStats& more) noexcept;

class AsyncCluster : public std::enable_shared_from_this<AsyncCluster> {
 public:
  AsyncCluster(asio::any_io_executor executor, RedisOptions options,
               std::shared_ptr<const net::TlsContext> tls);

  // The replies to every command of `batch` (RESP bytes as CommandBatch encodes them), in order.
  static async::Task<std::vector<RedisReply>> run(std::shared_ptr<AsyncCluster> self,
                                                  std::string bytes, std::size_t count,
                                                  CommandKind kind, std::string what);

  // SSUBSCRIBE `channel` on the primary that serves its slot (following MOVED and ASK within
  // command_timeout): the reply and the node connection that gave it, which is from then on a
  // subscriber (the router must serve nothing else: AsyncConnection::subscribe()).
  static async::Task<std::pair<RedisReply, std::shared_ptr<AsyncConnection>>> subscribe(
      std::shared_ptr<AsyncCluster> self, std::string channel);

  // Closes every node connection: calls in flight end with operation_aborted.
  void shut_down();
  AsyncConnectionStats stats() const;
  const RedisOptions& options() const noexcept { return options_; }
  const std::string& endpoint() const noexcept { return endpoint_; }
  const asio::any_io_executor& executor() const noexcept { return executor_; }

 private:
  struct Command;

  // The node's connection, opened on first use. Shared: a call holds it while it awaits, so a
  // concurrent shut_down() cannot destroy it under the call (the call then ends aborted).
  std::shared_ptr<AsyncConnection> node(const std::string& host, int port);
  std::shared_ptr<const ClusterLayout> current() const;
  // Reads CLUSTER SHARDS from a known primary or a configured node; keeps `seen` when none
  // answers and one is known (the caller's deadline decides), throws when none is.
  static async::Task<std::shared_ptr<const ClusterLayout>> reload(
      std::shared_ptr<AsyncCluster> self, std::shared_ptr<const ClusterLayout> seen);
  std::shared_ptr<const ClusterLayout> moved(const std::shared_ptr<const ClusterLayout>& seen,
                                             std::uint16_t slot, const std::string& host, int port);
  // One command on its own, following redirections until `deadline`.
  // With `subscriber`, the command is SSUBSCRIBE: the connection that takes it becomes a
  // subscriber, and *subscriber is set to it.
  static async::Task<RedisReply> single(std::shared_ptr<AsyncCluster> self, const Command& command,
                                        CommandKind kind, std::string what,
                                        std::chrono::steady_clock::time_point deadline,
                                        std::shared_ptr<AsyncConnection>* subscriber = nullptr);

  const asio::any_io_executor executor_;
  const RedisOptions options_;
  const std::shared_ptr<const net::TlsContext> tls_;
  const std::string endpoint_;
  mutable std::mutex mutex_;  // guards layout_ and nodes_
  std::shared_ptr<const ClusterLayout> layout_;
  std::map<std::string, std::shared_ptr<AsyncConnection>, std::less<>> nodes_;
  bool closed_ = false;
};

}  // namespace idem::redis::detail
