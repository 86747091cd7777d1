#include "idem/postgres/postgres_store.hpp"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "claim_logic.hpp"
#include "connection.hpp"
#include "idem/detail/contract.hpp"
#include "idem/error.hpp"
#include "pool_access.hpp"
#include "record_decoder.hpp"
#include "schema.hpp"
#include "sql_text.hpp"
#include "steps.hpp"

namespace idem::postgres {

namespace {

using detail::Params;
using detail::Statement;
using State = IdempotencyRecord::State;

using detail::check_fingerprint;
using detail::fits_token;

using detail::kStorePurgeChunkRows;

// While the listener is not LISTENing, waiters poll with this backoff.
constexpr auto kFirstPollDelay = std::chrono::milliseconds(2);
constexpr auto kMaxPollDelay = std::chrono::milliseconds(200);
// The listener reconnects with this backoff after losing its connection.
constexpr auto kFirstReconnectDelay = std::chrono::milliseconds(50);
constexpr auto kMaxReconnectDelay = std::chrono::seconds(2);

// ---- the listener ---------------------------------------------------------------------------

// One connection that LISTENs on the store's channel, read by one thread that wakes the waiters
// of the key named in each notification. Waiters compare a per-key generation (bumped by a
// notification) and an epoch (bumped whenever the listener connects or loses its connection) with
// what they saw before reading the record, so nothing that happens in between is missed.
//
// complete() and release() notify only when some listener holds the key's interest lock (a
// shared advisory lock, sql_text.hpp; DESIGN-NOTES §62). This thread takes it on its LISTENing
// session when a key gets its first waiter and releases it when the last one leaves; a key is
// `armed` while the lock is held. A waiter reads the record only once its key is armed (or in
// polling mode): a complete that committed before the lock was granted is then visible to that
// read (the lock waits for it), and one that commits after it notifies. A lost session takes its
// locks with it; they are taken again on the next one.
class Listener {
 public:
  struct Seen {
    bool listening = false;  // LISTENing with the key armed: a change of the key notifies
    std::uint64_t generation = 0;
    std::uint64_t epoch = 0;
  };
  enum class Wake { notified, state_changed, timed_out, stopped };

  Listener(std::shared_ptr<ConnectionPool> pool, const detail::StoreSql& sql)
      : pool_(std::move(pool)), sql_(sql) {}

  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  ~Listener() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    poke();
    thread_.join();
    ::close(wake_pipe_[0]);
    ::close(wake_pipe_[1]);
  }

  void start() {
    std::call_once(started_, [this] {
      if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
        throw StoreError("PostgresIdempotencyStore: cannot create the listener's wake-up pipe",
                         /*retryable=*/true);
      }
      thread_ = std::thread([this] { run(); });
    });
  }

  bool wait_listening(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return listening_; });
  }

  // Registers interest in `key` while a waiter waits on it (after start()).
  void enter(const std::string& key) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      // A key whose lock is still held (its unlock not yet run) needs nothing more.
      if (++keys_[key].waiters == 1 && !armed(key) && listening_) {
        todo_.push_back(key);
        wake = true;
      }
    }
    if (wake) poke();
  }
  void leave(const std::string& key) noexcept {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      auto it = keys_.find(key);
      if (it == keys_.end() || --it->second.waiters != 0) return;
      keys_.erase(it);
      if (held_.count(key) != 0) {
        try {
          todo_.push_back(key);
          wake = true;
        } catch (...) {
          // Out of memory: the lock stays until the session ends; it costs spurious notifies.
        }
      }
    }
    if (wake) poke();
  }

  // Until the key is armed, the listener is not LISTENing, its lock could not be taken, or
  // `timeout` or `stop`.
  void await_armed(const std::string& key, std::chrono::nanoseconds timeout, std::stop_token stop) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, stop, timeout,
                      [&] { return !listening_ || armed(key) || keys_.at(key).unarmable; });
  }

  Seen seen(const std::string& key) {
    std::lock_guard lock(mutex_);
    return Seen{listening_ && armed(key), keys_.at(key).generation, epoch_};
  }

  Wake wait(const std::string& key, const Seen& seen, std::chrono::nanoseconds timeout,
            std::stop_token stop) {
    std::unique_lock lock(mutex_);
    const auto changed = [&] {
      return keys_.at(key).generation != seen.generation || epoch_ != seen.epoch ||
             (listening_ && armed(key)) != seen.listening;
    };
    const bool woke = changed_.wait_for(lock, stop, timeout, changed);
    if (keys_.at(key).generation != seen.generation) return Wake::notified;
    if (woke) return Wake::state_changed;
    return stop.stop_requested() ? Wake::stopped : Wake::timed_out;
  }

  bool listening() const {
    std::lock_guard lock(mutex_);
    return listening_;
  }
  std::uint64_t notifications() const noexcept { return notifications_.load(); }
  std::uint64_t connects() const noexcept { return connects_.load(); }

 private:
  static constexpr std::string_view kCall = "PostgresIdempotencyStore listener";

  void poke() noexcept {
    const char byte = 1;
    (void)!::write(wake_pipe_[1], &byte, 1);  // a full pipe wakes the thread just as well
  }
  void drain() noexcept {
    char bytes[64];
    while (::read(wake_pipe_[0], bytes, sizeof bytes) > 0) {
    }
  }

  // A new session LISTENs (every key with waiters is to be locked on it), or the session is
  // lost (its locks are gone with it).
  void set_listening(bool listening) {
    {
      std::lock_guard lock(mutex_);
      if (listening_ == listening) return;
      listening_ = listening;
      ++epoch_;
      held_.clear();
      todo_.clear();
      for (auto& [key, state] : keys_) {
        state.unarmable = false;
        if (listening) todo_.push_back(key);
      }
    }
    changed_.notify_all();
  }

  void dispatch(PGconn* conn) {
    while (PGnotify* notify = PQnotifies(conn)) {
      const std::string key = notify->extra != nullptr ? notify->extra : "";
      PQfreemem(notify);
      notifications_.fetch_add(1);
      std::lock_guard lock(mutex_);
      auto it = keys_.find(key);
      if (it != keys_.end()) {
        ++it->second.generation;
        changed_.notify_all();
      }
    }
  }

  // Takes the interest locks of keys that gained their first waiter and releases those of keys
  // whose last waiter left, one statement each, until none is left to do. Throws when the
  // session is lost.
  void update_interest(detail::Connection& connection) {
    for (;;) {
      std::string key;
      bool take = false;
      {
        std::lock_guard lock(mutex_);
        for (;;) {
          if (todo_.empty()) return;
          key = std::move(todo_.front());
          todo_.pop_front();
          auto it = keys_.find(key);
          const bool held = held_.count(key) != 0;
          if (it != keys_.end() && !held && !it->second.unarmable) {
            take = true;
            break;
          }
          if (it == keys_.end() && held) {
            held_.erase(key);  // before the unlock: a waiter that comes meanwhile locks again
            break;
          }
        }
      }
      Params params;
      params.text(sql_.channel).text(key);
      try {
        (void)connection.run(take ? sql_.lock_interest : sql_.unlock_interest, params, kCall,
                             StatementKind::read);
      } catch (const PostgresError&) {
        if (connection.broken() || PQstatus(connection.raw()) != CONNECTION_OK) throw;
        // The lock table is full, or statement_timeout ran out: this key's waiters poll. A
        // failed unlock leaves a lock that costs spurious notifies until the session ends.
        if (take) {
          std::lock_guard lock(mutex_);
          auto it = keys_.find(key);
          if (it != keys_.end()) it->second.unarmable = true;
        }
        changed_.notify_all();
        dispatch(connection.raw());
        continue;
      }
      if (take) {
        {
          std::lock_guard lock(mutex_);
          held_.insert(key);
          if (keys_.count(key) == 0) todo_.push_back(key);  // its waiters left meanwhile: unlock
        }
        changed_.notify_all();
      }
      dispatch(connection.raw());
    }
  }

  // Waits for `delay` or a stop request; false when stopping.
  bool pause(std::chrono::milliseconds delay) {
    const auto until = std::chrono::steady_clock::now() + delay;
    while (!stopping_.load()) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd fd{wake_pipe_[0], POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(left.count()));
      drain();  // a waiter that came meanwhile is served once connected
    }
    return !stopping_.load();
  }

  void listen_until_lost() {
    std::unique_ptr<detail::Connection> connection = detail::PoolAccess::open_dedicated(*pool_);
    connection->exec("LISTEN " + detail::quote_identifier(sql_.channel), kCall,
                     StatementKind::read);
    connects_.fetch_add(1);
    set_listening(true);
    PGconn* conn = connection->raw();
    dispatch(conn);
    while (!stopping_.load()) {
      update_interest(*connection);
      // A notification that came in with a statement's result may sit unparsed in libpq's
      // buffer, where polling the socket would not see it.
      if (PQconsumeInput(conn) == 0) return;  // lost
      dispatch(conn);
      pollfd fds[2] = {{PQsocket(conn), POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) drain();  // stopping, or interest to update
      if (fds[0].revents != 0) {
        if (PQconsumeInput(conn) == 0) return;  // lost
        dispatch(conn);
        if (PQstatus(conn) != CONNECTION_OK) return;
      }
    }
  }

  void run() {
    auto delay = std::chrono::milliseconds(kFirstReconnectDelay);
    while (!stopping_.load()) {
      const std::uint64_t before = connects_.load();
      try {
        listen_until_lost();
      } catch (const std::exception&) {
        // Unreachable server: waiters poll meanwhile; try again after a pause.
      }
      set_listening(false);
      if (connects_.load() != before) delay = kFirstReconnectDelay;
      if (!pause(delay)) break;
      delay = std::min<std::chrono::milliseconds>(delay * 2, kMaxReconnectDelay);
    }
  }

  // A key is armed while its interest lock is held on the LISTENing connection (mutex_ held).
  bool armed(const std::string& key) const { return held_.count(key) != 0; }

  struct KeyState {
    std::size_t waiters = 0;
    std::uint64_t generation = 0;
    bool unarmable = false;  // its lock could not be taken on the current connection: it polls
  };

  std::shared_ptr<ConnectionPool> pool_;
  const detail::StoreSql& sql_;
  mutable std::mutex mutex_;
  std::condition_variable_any changed_;
  std::unordered_map<std::string, KeyState> keys_;  // the keys with waiters
  std::unordered_set<std::string> held_;            // interest locks held on the session
  std::deque<std::string> todo_;                    // keys whose lock to take or release
  bool listening_ = false;
  std::uint64_t epoch_ = 0;
  std::atomic<std::uint64_t> notifications_{0};
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<bool> stopping_{false};
  int wake_pipe_[2] = {-1, -1};
  std::once_flag started_;
  std::thread thread_;
};

}  // namespace

// ---- Impl -----------------------------------------------------------------------------------

class PostgresIdempotencyStore::Impl : public detail::StoreSql, public detail::PooledRunner {
 public:
  explicit Impl(std::shared_ptr<ConnectionPool> shared_pool)
      : StoreSql(shared_pool->options()),
        PooledRunner(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()),
        listener(pool, *this) {}

  void create_table() {
    const PostgresOptions& options = pool->options();
    const std::vector<std::string> steps = {
        // version 1
        "CREATE SEQUENCE IF NOT EXISTS " + sequence + " AS bigint; CREATE TABLE IF NOT EXISTS " +
            table +
            " (key text PRIMARY KEY, state text NOT NULL, token bigint NOT NULL, "
            "fingerprint text, lease_until timestamptz, took_over boolean NOT NULL DEFAULT false, "
            "completed_at timestamptz, expires_at timestamptz, value bytea, report text); "
            "CREATE INDEX IF NOT EXISTS " +
            detail::quote_identifier(options.records_table + "_expires_at") + " ON " + table +
            " (expires_at) WHERE state = 'completed'",
    };
    static_assert(kSchemaVersion == 1, "add the migration step for the new version");
    detail::prepare_schema(*pool, options, "store:" + options.records_table, steps,
                           "PostgresIdempotencyStore: create or migrate the table");
  }

  IdempotencyRecord decode(std::string_view key, const detail::Result& result, int row,
                           int first) const {
    return detail::decode_record(key, table_name, result, row, first);
  }

  std::shared_ptr<Clock> clock;

  Listener listener;
  std::atomic<std::uint64_t> waits{0};
  std::atomic<std::uint64_t> wakeups_by_notification{0};
  std::atomic<std::uint64_t> rechecks{0};
  std::atomic<std::size_t> blocked_waiters{0};
};

// ---- PostgresIdempotencyStore ---------------------------------------------------------------

PostgresIdempotencyStore::PostgresIdempotencyStore(PostgresOptions options)
    : PostgresIdempotencyStore(std::make_shared<ConnectionPool>(std::move(options))) {}

PostgresIdempotencyStore::PostgresIdempotencyStore(std::shared_ptr<ConnectionPool> pool) {
  if (!pool) throw InvalidArgument("PostgresIdempotencyStore needs a connection pool (got null)");
  impl_ = std::make_unique<Impl>(std::move(pool));
  impl_->create_table();
  wait_clock_ = impl_->clock;
}

PostgresIdempotencyStore::~PostgresIdempotencyStore() = default;

const std::shared_ptr<ConnectionPool>& PostgresIdempotencyStore::pool() const noexcept {
  return impl_->pool;
}

ClaimOutcome PostgresIdempotencyStore::do_claim(std::string_view key,
                                                std::optional<std::string_view> fingerprint,
                                                Millis lease) {
  detail::require_utf8_key("idempotency key", key);
  check_fingerprint(fingerprint);
  constexpr std::string_view kCall = "PostgresIdempotencyStore::claim";
  ConnectionPool::Lease connection = impl_->pool->acquire();
  detail::StoreClaim claim(*impl_, *impl_->clock, key, fingerprint, lease, kCall,
                           impl_->pool->target());
  while (!claim.read(
      detail::run_step(detail::PoolAccess::connection(connection), claim.step(), kCall))) {
  }
  return std::move(claim.outcome());
}

bool PostgresIdempotencyStore::do_complete(std::string_view key, std::uint64_t token,
                                           StoredValue value, const ExecutionReport& report,
                                           Millis ttl) {
  detail::require_utf8_key("idempotency key", key);
  if (!value.bytes) {
    throw InvalidArgument(
        "PostgresIdempotencyStore keeps values as bytes: StoredValue::bytes must be set (the "
        "coordinator encodes results with idem::Codec<T>)");
  }
  if (!fits_token(token)) return false;
  return impl_->answer(detail::store_complete(*impl_, key, token, *value.bytes, report,
                                              impl_->clock->wall_now(), ttl),
                       "PostgresIdempotencyStore::complete");
}

bool PostgresIdempotencyStore::do_release(std::string_view key, std::uint64_t token) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) return false;
  return impl_->answer(detail::store_release(*impl_, key, token),
                       "PostgresIdempotencyStore::release");
}

bool PostgresIdempotencyStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) return false;
  return impl_->answer(detail::store_renew(*impl_, key, token,
                                           detail::add_saturating(impl_->clock->wall_now(), lease)),
                       "PostgresIdempotencyStore::renew");
}

std::optional<IdempotencyRecord> PostgresIdempotencyStore::do_lookup(std::string_view key) {
  detail::require_utf8_key("idempotency key", key);
  constexpr std::string_view kCall = "PostgresIdempotencyStore::lookup";
  return detail::store_lookup_answer(
      *impl_, key, impl_->run(detail::store_lookup(*impl_, key), kCall), impl_->clock->wall_now());
}

std::size_t PostgresIdempotencyStore::do_purge_expired(const PurgeProgress& progress) {
  // One instant for the whole purge: results that expire while it runs wait for the next one.
  const WallTime now = impl_->clock->wall_now();
  std::size_t purged = 0;
  for (;;) {
    Params params;
    params.timestamptz(now);
    const auto removed = static_cast<std::size_t>(
        impl_
            ->run(impl_->purge_chunk, params, "PostgresIdempotencyStore::purge_expired",
                  StatementKind::write)
            .affected());
    purged += removed;
    if (removed > 0 && progress) progress(purged);
    if (removed < static_cast<std::size_t>(kStorePurgeChunkRows)) return purged;
  }
}

StoreCounts PostgresIdempotencyStore::do_counts() {
  Params params;
  params.timestamptz(impl_->clock->wall_now());
  const detail::Result row = impl_->run(impl_->count_by_state, params,
                                        "PostgresIdempotencyStore::counts", StatementKind::read);
  StoreCounts counts;
  counts.in_progress = static_cast<std::uint64_t>(row.int8(0, 0));
  counts.abandoned = static_cast<std::uint64_t>(row.int8(0, 1));
  counts.completed = static_cast<std::uint64_t>(row.int8(0, 2));
  counts.expired = static_cast<std::uint64_t>(row.int8(0, 3));
  return counts;
}

RecordPage PostgresIdempotencyStore::do_list(std::string_view prefix, std::size_t limit,
                                             std::string_view cursor) {
  if (!detail::is_utf8(prefix)) return {};  // no key (UTF-8 text) starts with it
  detail::require_utf8_key("list cursor", cursor);
  Params params;
  params.text(prefix).text(cursor).int8(static_cast<std::int64_t>(limit) + 1);
  const detail::Result result =
      impl_->run(impl_->list, params, "PostgresIdempotencyStore::list", StatementKind::read);
  RecordPage page;
  for (int row = 0; row < result.rows(); ++row) {
    if (page.records.size() == limit) {
      page.next = page.records.back().key;
      break;
    }
    page.records.push_back(detail::decode_record(result.bytes(row, 0), impl_->table_name, result,
                                                 row, 1, /*with_value=*/false));
  }
  return page;
}

bool PostgresIdempotencyStore::do_remove(std::string_view key, std::uint64_t token) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) return false;
  Params params;
  params.text(key).int8(static_cast<std::int64_t>(token)).text(impl_->channel);
  return impl_->run(impl_->remove, params, "PostgresIdempotencyStore::remove", StatementKind::write)
             .rows() > 0;
}

std::size_t PostgresIdempotencyStore::do_entry_count() {
  const detail::Result result = impl_->run(
      impl_->count, Params{}, "PostgresIdempotencyStore::entry_count", StatementKind::read);
  return static_cast<std::size_t>(result.int8(0, 0));
}

bool PostgresIdempotencyStore::listen(std::chrono::milliseconds timeout) {
  if (impl_->pool->options().wait_strategy != WaitStrategy::notify) return false;
  impl_->listener.start();
  return impl_->listener.wait_listening(timeout);
}

std::optional<IdempotencyRecord> PostgresIdempotencyStore::do_wait(std::string_view key,
                                                                   SteadyTime deadline,
                                                                   std::stop_token stop) {
  detail::require_utf8_key("idempotency key", key);
  if (impl_->pool->options().wait_strategy == WaitStrategy::poll) {
    return IdempotencyStore::do_wait(key, deadline, stop);
  }
  Impl& impl = *impl_;
  impl.listener.start();
  const std::string name(key);
  impl.listener.enter(name);
  struct Leave {
    Listener& listener;
    const std::string& key;
    ~Leave() { listener.leave(key); }
  } leave{impl.listener, name};
  // A complete notifies only while the listener holds the key's interest lock: wait until it
  // does (a round trip on the listener's connection) before the first read, so that read sees
  // the result or a notification follows it.
  if (const SteadyTime now = impl.clock->steady_now(); !stop.stop_requested() && now < deadline) {
    impl.listener.await_armed(name,
                              std::min<std::chrono::nanoseconds>(
                                  deadline - now, impl.pool->options().wait_recheck_interval),
                              stop);
  }

  bool counted = false;
  std::chrono::nanoseconds poll_delay = kFirstPollDelay;
  for (;;) {
    // What the listener had seen BEFORE the record is read: a notification sent after the read
    // changes it, so the wait below cannot miss it.
    const Listener::Seen seen = impl.listener.seen(name);
    std::optional<IdempotencyRecord> record = lookup(key);
    const WallTime now = impl.clock->wall_now();
    if (!idem::detail::held_at(record, now)) return record;
    const SteadyTime steady_now = impl.clock->steady_now();
    if (stop.stop_requested() || steady_now >= deadline) return record;
    std::chrono::nanoseconds slice = impl.pool->options().wait_recheck_interval;
    if (!seen.listening) {
      slice = poll_delay;  // no notification can come: poll until the listener is back
      poll_delay = std::min<std::chrono::nanoseconds>(poll_delay * 2, kMaxPollDelay);
    }
    slice = std::min<std::chrono::nanoseconds>(
        {slice, deadline - steady_now, record->lease_until - now});
    if (!counted) {
      counted = true;
      impl.waits.fetch_add(1);
    }
    impl.blocked_waiters.fetch_add(1);
    const Listener::Wake wake = impl.listener.wait(name, seen, slice, stop);
    impl.blocked_waiters.fetch_sub(1);
    if (wake == Listener::Wake::notified) {
      impl.wakeups_by_notification.fetch_add(1);
    } else if (wake != Listener::Wake::stopped) {
      impl.rechecks.fetch_add(1);
    }
  }
}

PostgresStoreStats PostgresIdempotencyStore::stats() const {
  PostgresStoreStats stats;
  stats.notifications_received = impl_->listener.notifications();
  stats.waits = impl_->waits.load();
  stats.wakeups_by_notification = impl_->wakeups_by_notification.load();
  stats.rechecks = impl_->rechecks.load();
  stats.blocked_waiters = impl_->blocked_waiters.load();
  stats.listening = impl_->listener.listening();
  stats.listener_connects = impl_->listener.connects();
  stats.pool = impl_->pool->stats();
  return stats;
}

}  // namespace idem::postgres
