#include "idem/sqlite/sqlite_recorder.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::sqlite {

namespace {

using detail::Connection;
using detail::GroupCommitQueue;
using detail::Statement;
using detail::WriteTransaction;

// The infinity_bus table, created exactly as infinity_bus creates it, so whichever program
// opens the file first makes the same table.
constexpr const char* kCreateProcessedLog =
    "CREATE TABLE IF NOT EXISTS processed_log ("
    " consumer TEXT NOT NULL,"
    " event_id TEXT NOT NULL,"
    " ts TEXT NOT NULL,"
    " PRIMARY KEY (consumer, event_id))";

constexpr const char* kCreateIdemTables =
    "CREATE TABLE IF NOT EXISTS idem_claims ("
    " consumer TEXT NOT NULL,"
    " event_id TEXT NOT NULL,"
    " token INTEGER NOT NULL,"
    " lease_until_ms INTEGER NOT NULL,"
    " PRIMARY KEY (consumer, event_id));"
    "CREATE TABLE IF NOT EXISTS idem_schema ("
    " component TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS idem_counters ("
    " name TEXT PRIMARY KEY,"
    " value INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO idem_schema(component, version) VALUES ('recorder', 1);"
    "INSERT OR IGNORE INTO idem_counters(name, value) VALUES ('claim_token', 0);";

constexpr std::string_view kSelectMarker =
    "SELECT 1 FROM processed_log WHERE consumer = ?1 AND event_id = ?2";
// is_processed_many(): ids per SELECT ... IN (...). With the consumer that is at most 513
// parameters, under the 999 of SQLite builds older than 3.32.
constexpr std::size_t kLookupChunk = 512;
constexpr std::string_view kInsertMarker =
    "INSERT OR IGNORE INTO processed_log(consumer, event_id, ts) VALUES (?1, ?2, ?3)";
constexpr std::string_view kSelectClaim =
    "SELECT token, lease_until_ms FROM idem_claims WHERE consumer = ?1 AND event_id = ?2";
constexpr std::string_view kNextToken =
    "UPDATE idem_counters SET value = value + 1 WHERE name = 'claim_token' RETURNING value";
// The claim itself. Under BEGIN IMMEDIATE the row was just read, so the WHERE cannot fail
// here; it stays so that the statement alone is a correct claim (a live lease is never
// overwritten, whatever ran before it).
constexpr std::string_view kUpsertClaim =
    "INSERT INTO idem_claims(consumer, event_id, token, lease_until_ms) VALUES (?1, ?2, ?3, ?4) "
    "ON CONFLICT(consumer, event_id) DO UPDATE SET token = excluded.token, "
    "lease_until_ms = excluded.lease_until_ms WHERE idem_claims.lease_until_ms <= ?5 "
    "RETURNING token";
constexpr std::string_view kDeleteClaimWithToken =
    "DELETE FROM idem_claims WHERE consumer = ?1 AND event_id = ?2 AND token = ?3";
constexpr std::string_view kDeleteClaim =
    "DELETE FROM idem_claims WHERE consumer = ?1 AND event_id = ?2";
constexpr std::string_view kRenewClaim =
    "UPDATE idem_claims SET lease_until_ms = ?4 WHERE consumer = ?1 AND event_id = ?2 AND "
    "token = ?3";
// julianday() reads every ISO-8601 form (Z, +00:00, other offsets, any number of fraction
// digits, none) as an instant, so rows from other writers age correctly; unparsable ts gives
// NULL and the row is kept.
//
// purge() walks processed_log in rowid order, one chunk of at most kPurgeChunkRows rows per
// write transaction: the table has no index on ts (its schema is infinity_bus's), so bounding
// the rows a chunk *scans*, not the rows it deletes, is what bounds how long the write lock is
// held. kPurgeChunkEnd finds the chunk's last rowid (NULL: the rest of the table is the chunk).
constexpr std::string_view kPurgeChunkEnd =
    "SELECT rowid FROM processed_log WHERE rowid > ?1 ORDER BY rowid LIMIT 1 OFFSET ?2";
constexpr std::string_view kPurgeMarkersInRange =
    "DELETE FROM processed_log WHERE rowid > ?2 AND rowid <= ?3 AND "
    "julianday(ts) < julianday(?1)";
constexpr std::string_view kPurgeClaims = "DELETE FROM idem_claims WHERE lease_until_ms < ?1";
constexpr std::int64_t kPurgeChunkRows = 2000;

constexpr std::string_view kCountMarkers =
    "SELECT consumer, count(*) FROM processed_log GROUP BY consumer";
constexpr std::string_view kCountLiveClaims =
    "SELECT consumer, count(*) FROM idem_claims WHERE lease_until_ms > ?1 GROUP BY consumer";
constexpr std::string_view kCountOldMarkers =
    "SELECT count(*) FROM processed_log WHERE julianday(ts) < julianday(?1)";
// Per consumer: markers older than the cutoff, and markers whose ts julianday() cannot read
// (never purged). One scan of processed_log.
constexpr std::string_view kCountPurgeableByConsumer =
    "SELECT consumer, coalesce(sum(julianday(ts) < julianday(?1)), 0), "
    "coalesce(sum(julianday(ts) IS NULL), 0) FROM processed_log GROUP BY consumer "
    "HAVING sum(julianday(ts) < julianday(?1)) > 0 OR sum(julianday(ts) IS NULL) > 0 "
    "ORDER BY consumer";
// The marker's time in Unix epoch milliseconds (NULL when SQLite cannot read the ts).
constexpr std::string_view kSelectMarkerTime =
    "SELECT CAST(round((julianday(ts) - 2440587.5) * 86400000.0) AS INTEGER) FROM processed_log "
    "WHERE consumer = ?1 AND event_id = ?2";

// Lease deadlines are stored as milliseconds and returned as WallTime, whose nanosecond count
// overflows past this many milliseconds (year 2262).
constexpr std::int64_t kMaxMs =
    std::chrono::duration_cast<std::chrono::milliseconds>(WallTime::duration::max()).count();
// 0001-01-01T00:00:00Z: the earliest instant an ISO-8601 string can name.
constexpr std::int64_t kMinMs = -62135596800000;

std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > kMaxMs - b) return kMaxMs;
  if (b < 0 && a < kMinMs - b) return kMinMs;
  return a + b;
}

WallTime from_ms(std::int64_t ms) {
  return WallTime(std::chrono::milliseconds(std::clamp(ms, kMinMs, kMaxMs)));
}

std::int64_t to_ms(WallTime t) {
  return std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::string marker_timestamp(WallTime t) {
  using namespace std::chrono;
  const auto us = floor<microseconds>(t.time_since_epoch());
  const auto day = floor<days>(us);
  const year_month_day ymd{sys_days(day)};
  const hh_mm_ss<microseconds> time{us - day};
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%04d-%02u-%02uT%02d:%02d:%02d.%06lld+00:00",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(time.hours().count()),
                static_cast<int>(time.minutes().count()), static_cast<int>(time.seconds().count()),
                static_cast<long long>(time.subseconds().count()));
  return buffer;
}

// ---- Impl -----------------------------------------------------------------------------------

namespace detail {

// One mark_processed() call, or one whole mark_processed_many() batch, waiting in the
// group-commit queue. A batch is one entry, so its markers always share one transaction.
struct PendingMark : GroupCommitQueue::Entry {
  std::string_view consumer;
  std::string_view event_id;           // a single mark
  std::span<const std::string> batch;  // a batch (event_id unused)
  bool is_batch = false;
  std::string ts;
};

}  // namespace detail

using detail::PendingMark;

class SqliteIdempotencyRecorder::Impl {
 public:
  Impl(std::string path, SqliteOptions options)
      : path_(std::move(path)), options_(std::move(options)) {
    for (std::size_t i = 0; i < select_markers_in_.size(); ++i) {
      std::string& sql = select_markers_in_[i];
      sql = "SELECT event_id FROM processed_log WHERE consumer = ?1 AND event_id IN (";
      for (std::size_t k = 0; k < (std::size_t{1} << i); ++k)
        sql += (k == 0 ? "?" : ", ?") + std::to_string(k + 2);
      sql += ")";
    }
  }

  // Holds the writer connection for one write, and refuses a thread that already holds it
  // (a transactional handler calling back into its own recorder), which would deadlock.
  class WriterLock {
   public:
    WriterLock(Impl& impl, std::string_view operation) : impl_(impl) {
      impl.throw_if_writer_thread(operation);
      lock_ = std::unique_lock(impl.connections_.writer_mutex());
      impl.writer_thread_.store(std::this_thread::get_id());
    }
    WriterLock(const WriterLock&) = delete;
    WriterLock& operator=(const WriterLock&) = delete;
    ~WriterLock() { impl_.writer_thread_.store(std::thread::id()); }

    Connection& connection() { return impl_.connections_.writer(); }

   private:
    Impl& impl_;
    std::unique_lock<std::mutex> lock_;
  };

  using Prefer = detail::ConnectionSet::Prefer;

  // The connection for one read (ConnectionSet::ReadLease). A thread inside run_transactional()
  // holds the writer: its reads go through its own transaction, so a handler sees its writes.
  class ReadLease : public detail::ConnectionSet::ReadLease {
   public:
    explicit ReadLease(Impl& impl, Prefer prefer = Prefer::reader)
        : detail::ConnectionSet::ReadLease(
              impl.connections_, prefer,
              /*holds_writer=*/impl.writer_thread_.load() == std::this_thread::get_id()) {}
  };

  void open();

  void throw_if_writer_thread(std::string_view operation) const {
    if (writer_thread_.load() == std::this_thread::get_id()) {
      throw Error(ErrorCode::reentry,
                  "SqliteIdempotencyRecorder::" + std::string(operation) +
                      " was called from inside run_transactional() on the same recorder; it "
                      "would wait for the transaction that is running it (write through the "
                      "SqliteTransaction instead)");
    }
  }

  std::int64_t now_ms() const { return to_ms(clock_->wall_now()); }

  // "SELECT event_id ... IN (?2, ..., ?<slots + 1>)"; `slots` is a power of two <= kLookupChunk.
  const std::string& select_markers_in(std::size_t slots) const {
    return select_markers_in_[static_cast<std::size_t>(std::countr_zero(slots))];
  }

  bool marker_exists(Connection& connection, std::string_view consumer, std::string_view event_id) {
    Statement select = connection.prepare(kSelectMarker);
    select.bind(1, consumer).bind(2, event_id);
    return select.step();
  }

  // Commits the marks at the front of the queue in one transaction, for the caller at the
  // front. `taken` counts the queue's leading entries this commit holds; it grows while the
  // transaction is open, because marks that queue up while it inserts join it for free. Only the
  // committing thread pops entries, so positions in the queue stay valid. A transaction takes
  // entries until it holds max_batch_size markers; a batch entry is always taken whole (the
  // caller's own entry even when it alone is larger).
  void write_queued_marks(std::size_t& taken) {
    std::size_t rows = 0;
    const auto collect = [&] {
      std::vector<PendingMark*> more;
      marks_.collect(taken, [&](GroupCommitQueue::Entry* entry) {
        auto* mark = static_cast<PendingMark*>(entry);
        if (taken > 0 && rows >= options_.max_batch_size) return false;
        if (taken > 0 && mark->is_batch && rows + mark->batch.size() > options_.max_batch_size)
          return false;  // a batch that would overflow this transaction waits for the next one
        more.push_back(mark);
        rows += mark->is_batch ? mark->batch.size() : 1;
        return true;
      });
      return more;
    };
    auto batch = collect();  // at least the caller's own mark, so a failure fails it too
    WriterLock lock(*this, "mark_processed");
    Connection& connection = lock.connection();
    WriteTransaction tx(connection);
    // Every collected mark is inserted before the loop can end: `taken` already counts them.
    bool yielded = false;
    for (;;) {
      for (const PendingMark* mark : batch) {
        const auto insert_one = [&](std::string_view event_id) {
          Statement insert = connection.prepare(kInsertMarker);
          insert.bind(1, mark->consumer).bind(2, event_id).bind(3, std::string_view(mark->ts));
          insert.run();
        };
        if (mark->is_batch) {
          for (const std::string& event_id : mark->batch)
            insert_one(event_id);
        } else {
          insert_one(mark->event_id);
        }
      }
      if (rows >= options_.max_batch_size) break;
      if (batch.empty()) {
        // Callers whose marks just committed are about to queue their next one; giving them
        // the CPU once before the (expensive) commit lets them join it. Only when the last
        // commit had company: a lone caller (one consumer thread) would just hand its core to
        // some other process (15% of its mark time through RabbitMQ at prefetch 64).
        if (yielded || last_commit_entries_ < 2) break;
        yielded = true;
        std::this_thread::yield();
      }
      batch = collect();
    }
    last_commit_entries_ = taken;
    tx.commit();
    marks_committed_.fetch_add(rows, std::memory_order_relaxed);
    mark_commits_.fetch_add(1, std::memory_order_relaxed);
  }

  // Queues `mark` and returns once a transaction holding it committed (this thread's, when it
  // reaches the front of the queue, or another caller's); rethrows that commit's failure.
  void commit_mark(PendingMark& mark) {
    marks_.run(mark, [this](std::size_t& taken) { write_queued_marks(taken); });
  }

  std::string path_;
  SqliteOptions options_;
  std::shared_ptr<Clock> clock_;
  detail::ConnectionSet connections_{path_, options_};  // opened by open()
  // The thread holding the writer (WriterLock), if any.
  std::atomic<std::thread::id> writer_thread_{};

  // SQL of is_processed_many()'s lookups, one per power-of-two size up to kLookupChunk.
  std::array<std::string, std::bit_width(kLookupChunk)> select_markers_in_;

  // Group commit (LevelDB's writer queue): the waiter at the front commits a batch of the
  // queue's marks for everyone in it.
  GroupCommitQueue marks_;
  // Entries the last transaction of write_queued_marks() held (it reads and writes this only
  // under the writer lock): 1 means no concurrent caller, so there is no one to yield to.
  std::size_t last_commit_entries_ = 0;
  std::atomic<std::uint64_t> marks_committed_{0};
  std::atomic<std::uint64_t> mark_commits_{0};

 private:
  bool check_schema();
  void create_schema();
};

void SqliteIdempotencyRecorder::Impl::open() {
  detail::check_open_arguments(path_, options_);
  clock_ = options_.clock ? options_.clock : system_clock();
  connections_.open([this] { return check_schema(); }, [this] { create_schema(); });
}

bool SqliteIdempotencyRecorder::Impl::check_schema() {
  // Only reads: a file refused here is left exactly as it was (ConnectionSet::open switches the
  // journal mode and creates tables only after this returned).
  Connection& writer = connections_.writer();
  int idem_tables = 0;
  bool has_processed_log = false;
  bool has_schema_table = false;
  {
    Statement tables = writer.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN "
        "('processed_log', 'idem_claims', 'idem_schema', 'idem_counters')");
    while (tables.step()) {
      const std::string name = tables.column_text(0);
      if (name == "processed_log") {
        has_processed_log = true;
      } else {
        ++idem_tables;
        if (name == "idem_schema") has_schema_table = true;
      }
    }
  }

  if (has_processed_log) {
    // A processed_log made by some other program must still have the columns we read and write.
    int expected_columns = 0;
    Statement info = writer.prepare("SELECT name FROM pragma_table_info('processed_log')");
    while (info.step()) {
      const std::string name = info.column_text(0);
      if (name == "consumer" || name == "event_id" || name == "ts") ++expected_columns;
    }
    if (expected_columns != 3) {
      throw SqliteError(ErrorCode::store_not_a_database,
                        "'" + path_ +
                            "' has a processed_log table without the columns (consumer, "
                            "event_id, ts) idem and infinity_bus use; nothing was changed",
                        SQLITE_ERROR, SQLITE_ERROR, false, false);
    }
  }

  if (has_schema_table) {
    Statement version =
        writer.prepare("SELECT version FROM idem_schema WHERE component = 'recorder'");
    if (version.step() && version.column_int64(0) > kSchemaVersion) {
      throw SqliteError(ErrorCode::store_open_failed,
                        "'" + path_ + "' uses idem recorder schema version " +
                            std::to_string(version.column_int64(0)) +
                            ", newer than this idem understands (" +
                            std::to_string(kSchemaVersion) + "); upgrade idem",
                        SQLITE_ERROR, SQLITE_ERROR, false, false);
    }
  }

  if (!has_processed_log && options_.read_only) {
    throw SqliteError(ErrorCode::store_read_only,
                      "'" + path_ +
                          "' has no processed_log table and is opened read-only, so it "
                          "cannot be created",
                      SQLITE_READONLY, SQLITE_READONLY, false, false);
  }
  if (!has_processed_log && !options_.create_schema) {
    throw SqliteError(ErrorCode::store_error,
                      "the recorder's tables (processed_log) do not exist in '" + path_ +
                          "', and create_schema is false",
                      SQLITE_ERROR, SQLITE_ERROR, false, false);
  }
  // An infinity_bus file (processed_log only) opened read-only or with create_schema = false
  // stays as it is: checks, marks, counts and purges of markers work; claims need idem_claims.
  return !has_processed_log || idem_tables < 3;
}

void SqliteIdempotencyRecorder::Impl::create_schema() {
  // One write transaction, so processes opening a new file at once create it exactly once.
  WriteTransaction tx(connections_.writer());
  connections_.writer().exec_script(kCreateProcessedLog);
  connections_.writer().exec_script(kCreateIdemTables);
  tx.commit();
}

// ---- SqliteIdempotencyRecorder --------------------------------------------------------------

SqliteIdempotencyRecorder::SqliteIdempotencyRecorder(std::string path, SqliteOptions options)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(options))) {
  impl_->open();
}

SqliteIdempotencyRecorder::~SqliteIdempotencyRecorder() = default;

SqliteRecorderStats SqliteIdempotencyRecorder::stats() const {
  SqliteRecorderStats stats;
  stats.marks = impl_->marks_committed_.load(std::memory_order_relaxed);
  stats.mark_commits = impl_->mark_commits_.load(std::memory_order_relaxed);
  stats.queued_marks = impl_->marks_.size();
  return stats;
}

const std::string& SqliteIdempotencyRecorder::path() const noexcept {
  return impl_->path_;
}
const SqliteOptions& SqliteIdempotencyRecorder::options() const noexcept {
  return impl_->options_;
}

bool SqliteIdempotencyRecorder::do_is_processed(std::string_view consumer,
                                                std::string_view event_id) {
  Impl::ReadLease lease(*impl_, Impl::Prefer::idle_writer);
  return impl_->marker_exists(lease.connection(), consumer, event_id);
}

void SqliteIdempotencyRecorder::do_mark_processed(std::string_view consumer,
                                                  std::string_view event_id) {
  impl_->throw_if_writer_thread("mark_processed");
  PendingMark mark;
  mark.consumer = consumer;
  mark.event_id = event_id;
  mark.ts = marker_timestamp(impl_->clock_->wall_now());

  impl_->commit_mark(mark);
}

std::vector<bool> SqliteIdempotencyRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  std::vector<bool> processed(event_ids.size(), false);
  Impl::ReadLease lease(*impl_, Impl::Prefer::idle_writer);
  Connection& connection = lease.connection();
  std::unordered_set<std::string> found;
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kLookupChunk) {
    const std::size_t n = std::min(kLookupChunk, event_ids.size() - offset);
    // Statements come in power-of-two sizes, so a connection caches at most ten of them; the
    // spare placeholders repeat the chunk's last id.
    const std::size_t slots = std::bit_ceil(n);
    Statement select = connection.prepare(impl_->select_markers_in(slots));
    select.bind(1, consumer);
    for (std::size_t i = 0; i < slots; ++i) {
      select.bind(static_cast<int>(i + 2),
                  std::string_view(event_ids[offset + std::min(i, n - 1)]));
    }
    while (select.step())
      found.insert(select.column_text(0));
  }
  for (std::size_t i = 0; i < event_ids.size(); ++i)
    processed[i] = found.contains(event_ids[i]);
  return processed;
}

void SqliteIdempotencyRecorder::do_mark_processed_many(std::string_view consumer,
                                                       std::span<const std::string> event_ids) {
  impl_->throw_if_writer_thread("mark_processed_many");
  if (event_ids.empty()) return;
  PendingMark mark;
  mark.consumer = consumer;
  mark.batch = event_ids;
  mark.is_batch = true;
  mark.ts = marker_timestamp(impl_->clock_->wall_now());
  impl_->commit_mark(mark);
}

Claim SqliteIdempotencyRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                          Millis lease) {
  impl_->throw_if_writer_thread("claim");
  // Fast path for redeliveries, without the write lock: a marker only goes away by purge().
  if (is_processed(consumer, event_id)) return Claim{Claim::Status::processed};

  Impl::WriterLock lock(*impl_, "claim");
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  const std::int64_t now = impl_->now_ms();
  if (impl_->marker_exists(connection, consumer, event_id)) {
    return Claim{Claim::Status::processed};
  }
  bool had_claim = false;
  {
    Statement select = connection.prepare(kSelectClaim);
    select.bind(1, consumer).bind(2, event_id);
    if (select.step()) {
      const std::int64_t lease_until = select.column_int64(1);
      if (lease_until > now) {
        Claim busy{Claim::Status::in_progress};
        busy.lease_until = from_ms(lease_until);
        return busy;
      }
      had_claim = true;  // its lease passed: a takeover
    }
  }
  std::int64_t token = 0;
  {
    Statement next = connection.prepare(kNextToken);
    if (!next.step()) {
      throw StoreError("the claim_token counter row is missing from idem_counters in '" +
                       impl_->path_ + "'");
    }
    token = next.column_int64(0);
  }
  const std::int64_t lease_until = saturating_add(now, lease.count());
  {
    Statement upsert = connection.prepare(kUpsertClaim);
    upsert.bind(1, consumer).bind(2, event_id).bind(3, token).bind(4, lease_until).bind(5, now);
    if (!upsert.step()) {
      throw StoreError("claim of (" + std::string(consumer) + ", " + std::string(event_id) +
                       ") found a live lease inside its own write transaction");
    }
    token = upsert.column_int64(0);
    while (upsert.step()) {
    }
  }
  tx.commit();
  Claim acquired{Claim::Status::acquired};
  acquired.token = static_cast<std::uint64_t>(token);
  acquired.lease_until = from_ms(lease_until);
  acquired.took_over = had_claim;
  return acquired;
}

bool SqliteIdempotencyRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                            std::uint64_t token) {
  if (token > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
  Impl::WriterLock lock(*impl_, "complete");
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  {
    Statement drop = connection.prepare(kDeleteClaimWithToken);
    drop.bind(1, consumer).bind(2, event_id).bind(3, static_cast<std::int64_t>(token));
    if (drop.run() == 0) return false;  // fenced off (or never claimed): write nothing
  }
  {
    Statement insert = connection.prepare(kInsertMarker);
    const std::string ts = marker_timestamp(impl_->clock_->wall_now());
    insert.bind(1, consumer).bind(2, event_id).bind(3, std::string_view(ts));
    insert.run();
  }
  tx.commit();
  return true;
}

bool SqliteIdempotencyRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token) {
  if (token > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
  Impl::WriterLock lock(*impl_, "release");
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  Statement drop = connection.prepare(kDeleteClaimWithToken);
  drop.bind(1, consumer).bind(2, event_id).bind(3, static_cast<std::int64_t>(token));
  if (drop.run() == 0) return false;
  tx.commit();
  return true;
}

bool SqliteIdempotencyRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                         std::uint64_t token, Millis lease) {
  if (token > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
  Impl::WriterLock lock(*impl_, "renew");
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  Statement update = connection.prepare(kRenewClaim);
  update.bind(1, consumer)
      .bind(2, event_id)
      .bind(3, static_cast<std::int64_t>(token))
      .bind(4, saturating_add(impl_->now_ms(), lease.count()));
  if (update.run() == 0) return false;
  tx.commit();
  return true;
}

bool SqliteIdempotencyRecorder::do_run_transactional(std::string_view consumer,
                                                     std::string_view event_id,
                                                     const std::function<void(Transaction&)>& fn) {
  Impl::WriterLock lock(*impl_, "run_transactional");
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  {
    Statement insert = connection.prepare(kInsertMarker);
    const std::string ts = marker_timestamp(impl_->clock_->wall_now());
    insert.bind(1, consumer).bind(2, event_id).bind(3, std::string_view(ts));
    if (insert.run() == 0) return false;  // already processed: roll back, do not run
  }
  {
    Statement select = connection.prepare(kSelectClaim);
    select.bind(1, consumer).bind(2, event_id);
    if (select.step() && select.column_int64(1) > impl_->now_ms()) {
      // An exclusive-mode owner is running this event right now.
      throw AlreadyInProgress("(" + std::string(consumer) + ", " + std::string(event_id) +
                              ") is claimed by another delivery until " +
                              marker_timestamp(from_ms(select.column_int64(1))));
    }
  }
  {
    // A dead claim goes with the commit; its old owner's complete() then finds no token.
    Statement drop = connection.prepare(kDeleteClaim);
    drop.bind(1, consumer).bind(2, event_id);
    drop.run();
  }
  SqliteTransaction handle(connection, consumer, event_id);
  fn(handle);  // throws → ~WriteTransaction rolls back the marker and fn's writes
  if (sqlite3_get_autocommit(connection.db()) != 0) {
    throw StoreError("the handler for (" + std::string(consumer) + ", " + std::string(event_id) +
                         ") ended idem's transaction itself (COMMIT/ROLLBACK through db(), or an "
                         "error that made SQLite roll back); whether its writes and the marker "
                         "were committed is unknown",
                     /*retryable=*/false, /*in_doubt=*/true);
  }
  tx.commit();
  return true;
}

std::size_t SqliteIdempotencyRecorder::do_purge(std::chrono::system_clock::duration older_than,
                                                const PurgeProgress& progress) {
  const std::int64_t age_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(older_than).count();
  const std::int64_t cutoff_ms = saturating_add(impl_->now_ms(), -age_ms);
  const std::string cutoff = marker_timestamp(from_ms(cutoff_ms));

  std::size_t markers = 0;
  std::int64_t after = std::numeric_limits<std::int64_t>::min();  // rowids may be negative
  for (bool last_chunk = false; !last_chunk;) {
    std::int64_t removed = 0;
    {
      Impl::WriterLock lock(*impl_, "purge");
      Connection& connection = lock.connection();
      WriteTransaction tx(connection);
      std::int64_t chunk_end = std::numeric_limits<std::int64_t>::max();
      {
        Statement end = connection.prepare(kPurgeChunkEnd);
        end.bind(1, after).bind(2, kPurgeChunkRows - 1);
        if (end.step()) {
          chunk_end = end.column_int64(0);
        } else {
          last_chunk = true;
        }
      }
      Statement purge_markers = connection.prepare(kPurgeMarkersInRange);
      purge_markers.bind(1, std::string_view(cutoff)).bind(2, after).bind(3, chunk_end);
      removed = purge_markers.run();
      // Claims are few (one per event being handled): one statement, with the last chunk. A
      // file with only infinity_bus's table (opened with create_schema = false) has none.
      if (last_chunk && detail::has_table(connection, "idem_claims")) {
        Statement purge_claims = connection.prepare(kPurgeClaims);
        purge_claims.bind(1, cutoff_ms);
        purge_claims.run();
      }
      tx.commit();
      after = chunk_end;
      if (chunk_end == std::numeric_limits<std::int64_t>::max()) last_chunk = true;
    }
    markers += static_cast<std::size_t>(removed);
    if (removed > 0 && progress) progress(markers);  // outside the write lock
  }
  return markers;
}

std::vector<ConsumerCounts> SqliteIdempotencyRecorder::do_consumer_counts() {
  std::map<std::string, ConsumerCounts, std::less<>> by_name;
  const auto entry = [&](std::string name) -> ConsumerCounts& {
    auto& counts = by_name[name];
    counts.consumer = std::move(name);
    return counts;
  };
  Impl::ReadLease lease(*impl_);
  Connection& connection = lease.connection();
  {
    Statement markers = connection.prepare(kCountMarkers);
    while (markers.step()) {
      entry(markers.column_text(0)).processed = static_cast<std::uint64_t>(markers.column_int64(1));
    }
  }
  if (detail::has_table(connection, "idem_claims")) {  // absent from an infinity_bus file
    Statement claims = connection.prepare(kCountLiveClaims);
    claims.bind(1, impl_->now_ms());
    while (claims.step()) {
      entry(claims.column_text(0)).in_progress = static_cast<std::uint64_t>(claims.column_int64(1));
    }
  }
  std::vector<ConsumerCounts> result;
  result.reserve(by_name.size());
  for (auto& [name, counts] : by_name)
    result.push_back(std::move(counts));
  return result;
}

std::size_t SqliteIdempotencyRecorder::do_count_purgeable(
    std::chrono::system_clock::duration older_than) {
  const std::int64_t age_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(older_than).count();
  const std::string cutoff = marker_timestamp(from_ms(saturating_add(impl_->now_ms(), -age_ms)));
  Impl::ReadLease lease(*impl_);
  Statement count = lease.connection().prepare(kCountOldMarkers);
  count.bind(1, std::string_view(cutoff));
  return count.step() ? static_cast<std::size_t>(count.column_int64(0)) : 0;
}

PurgeableMarkers SqliteIdempotencyRecorder::do_purgeable_markers(
    std::chrono::system_clock::duration older_than) {
  const std::int64_t age_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(older_than).count();
  const std::string cutoff = marker_timestamp(from_ms(saturating_add(impl_->now_ms(), -age_ms)));
  Impl::ReadLease lease(*impl_);
  Statement count = lease.connection().prepare(kCountPurgeableByConsumer);
  count.bind(1, std::string_view(cutoff));
  PurgeableMarkers markers;
  while (count.step()) {
    PurgeableMarkers::Consumer consumer;
    consumer.consumer = count.column_text(0);
    consumer.old = static_cast<std::uint64_t>(count.column_int64(1));
    consumer.unreadable = static_cast<std::uint64_t>(count.column_int64(2));
    markers.old += consumer.old;
    markers.unreadable += consumer.unreadable;
    markers.consumers.push_back(std::move(consumer));
  }
  return markers;
}

MarkerInspection SqliteIdempotencyRecorder::do_inspect(std::string_view consumer,
                                                       std::string_view event_id) {
  MarkerInspection result;
  Impl::ReadLease lease(*impl_);
  Connection& connection = lease.connection();
  {
    Statement marker = connection.prepare(kSelectMarkerTime);
    marker.bind(1, consumer).bind(2, event_id);
    if (marker.step()) {
      result.processed = true;
      if (!marker.column_is_null(0)) result.processed_at = from_ms(marker.column_int64(0));
    }
  }
  if (detail::has_table(connection, "idem_claims")) {  // absent from an infinity_bus file
    Statement claim = connection.prepare(kSelectClaim);
    claim.bind(1, consumer).bind(2, event_id);
    if (claim.step()) {
      const std::int64_t lease_until = claim.column_int64(1);
      result.claim =
          MarkerInspection::OpenClaim{static_cast<std::uint64_t>(claim.column_int64(0)),
                                      from_ms(lease_until), lease_until > impl_->now_ms()};
    }
  }
  return result;
}

}  // namespace idem::sqlite
