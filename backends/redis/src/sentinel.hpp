// Redis Sentinel on the blocking face (not installed). A Sentinel group watches one primary and
// its replicas under a name; when the primary fails, the sentinels promote a replica and announce
// it (+switch-master). A client asks any sentinel for the current primary's address, checks that
// the server there really is a primary (ROLE), and asks again after a failover (the Sentinel
// client guidelines).
//
// SentinelGroup, one per ConnectionPool:
//  * connect() opens a connection to the primary: asks the sentinels in turn (starting with the
//    one that answered last) with SENTINEL get-master-addr-by-name, connects there, and checks
//    ROLE; a server that is not (yet) a primary, or a sentinel group that names none, is asked
//    again until connect_timeout.
//  * epoch() counts the primaries the pool has known: it moves on when a sentinel announces
//    +switch-master for this name, or a command meets -READONLY (a demoted primary). The pool
//    drops every connection opened in an earlier epoch instead of reusing it.
//  * A watch thread, started by the first connect(), keeps a subscription to +switch-master on
//    one sentinel (another when it fails) and is stopped and joined by the destructor.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::net {
class TlsContext;
}

namespace idem::redis::detail {

class SentinelGroup : public std::enable_shared_from_this<SentinelGroup> {
 public:
  SentinelGroup(const RedisOptions& options, std::shared_ptr<const net::TlsContext> tls);
  ~SentinelGroup();
  SentinelGroup(const SentinelGroup&) = delete;
  SentinelGroup& operator=(const SentinelGroup&) = delete;

  // A connection to the current primary (AUTH, SELECT and ROLE done), tagged with the epoch it
  // was opened in. Throws RedisError: connect (retryable: no sentinel answered, none names a
  // reachable primary, or the named server is still a replica at connect_timeout), auth, tls; a
  // name no sentinel monitors is a non-retryable RedisError (a configuration mistake).
  std::unique_ptr<RedisConnection> connect();

  std::uint64_t epoch() const noexcept { return epoch_.load(std::memory_order_acquire); }
  // The watch saw +switch-master (or lost its sentinel): the primary has moved on.
  void primary_changed() noexcept { epoch_.fetch_add(1, std::memory_order_acq_rel); }
  // A connection opened in epoch `seen` met -READONLY: its server is no longer the primary. Moves
  // the epoch on once however many connections of that epoch report it.
  void primary_demoted(std::uint64_t seen) noexcept {
    epoch_.compare_exchange_strong(seen, seen + 1, std::memory_order_acq_rel);
  }

  const RedisOptions& options() const noexcept { return options_; }

 private:
  struct Answer {
    enum class Kind { address, unknown_name, unreachable } kind = Kind::unreachable;
    RedisNode primary;
    std::string detail;  // why a sentinel did not answer, for the message
  };
  // A connection to sentinel `index` (AUTH with the sentinels' credentials).
  std::unique_ptr<RedisConnection> open_sentinel(std::size_t index) const;
  Answer ask(std::size_t index) const;
  void start_watch();
  void watch();
  // Sleeps up to `ms` unless the destructor asks the watch to stop; true when it does.
  bool stop_requested_within(int ms) const;

  const RedisOptions options_;
  const RedisOptions sentinel_options_;  // how the sentinels themselves are reached
  const std::shared_ptr<const net::TlsContext> tls_;
  std::atomic<std::uint64_t> epoch_{0};
  std::atomic<std::size_t> preferred_{0};  // the sentinel that answered last
  std::once_flag watch_started_;
  int stop_fd_ = -1;  // an eventfd the destructor writes to wake the watch
  std::thread watch_;
};

}  // namespace idem::redis::detail
