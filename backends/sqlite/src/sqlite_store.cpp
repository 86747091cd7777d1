#include "idem/sqlite/sqlite_store.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "idem/detail/contract.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::sqlite {

namespace {

using detail::Connection;
using detail::GroupCommitQueue;
using detail::Statement;
using detail::WriteTransaction;

// idem_schema and idem_counters are created exactly as the recorder creates them, so whichever
// component opens a file first makes the same tables, and both draw tokens from claim_token.
constexpr const char* kCreateStoreTables =
    "CREATE TABLE IF NOT EXISTS idem_records ("
    " key TEXT PRIMARY KEY NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),"
    " token INTEGER NOT NULL,"
    " fingerprint TEXT,"
    " lease_until_ms INTEGER,"
    " completed_at_ms INTEGER,"
    " expires_at_ms INTEGER,"
    " value BLOB,"
    " report TEXT,"
    " took_over INTEGER NOT NULL DEFAULT 0);"
    // purge_expired() finds expired results without scanning the claims and live results.
    "CREATE INDEX IF NOT EXISTS idem_records_expiry ON idem_records(expires_at_ms)"
    " WHERE state = 'completed';"
    "CREATE TABLE IF NOT EXISTS idem_schema ("
    " component TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS idem_counters ("
    " name TEXT PRIMARY KEY,"
    " value INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO idem_schema(component, version) VALUES ('store', 1);"
    "INSERT OR IGNORE INTO idem_counters(name, value) VALUES ('claim_token', 0);";

// The claim. The new token is the counter's next value (the counter itself is advanced by
// kAdvanceCounter only when this statement claimed, so a replay writes nothing). A live record is
// never touched, whatever its fingerprint: the WHERE admits only an expired result or a claim
// whose lease has ended, and a row idem cannot read (unknown state, NULL deadline) is neither.
constexpr std::string_view kClaim =
    "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms, took_over) "
    "VALUES (?1, 'in_progress', "
    "COALESCE((SELECT value FROM idem_counters WHERE name = 'claim_token'), 0) + 1, ?2, ?3, 0) "
    "ON CONFLICT(key) DO UPDATE SET state = 'in_progress', token = excluded.token, "
    "fingerprint = excluded.fingerprint, lease_until_ms = excluded.lease_until_ms, "
    "completed_at_ms = NULL, expires_at_ms = NULL, value = NULL, report = NULL, "
    "took_over = (idem_records.state = 'in_progress') "
    "WHERE (idem_records.state = 'completed' AND idem_records.expires_at_ms <= ?4) "
    "OR (idem_records.state = 'in_progress' AND idem_records.lease_until_ms <= ?4) "
    "RETURNING token, took_over";
constexpr std::string_view kAdvanceCounter =
    "UPDATE idem_counters SET value = ?1 WHERE name = 'claim_token'";
constexpr std::string_view kSelectRecord =
    "SELECT state, token, fingerprint, lease_until_ms, completed_at_ms, expires_at_ms, value, "
    "report FROM idem_records WHERE key = ?1";
constexpr std::string_view kComplete =
    "UPDATE idem_records SET state = 'completed', lease_until_ms = NULL, completed_at_ms = ?3, "
    "expires_at_ms = ?4, value = ?5, report = ?6 "
    "WHERE key = ?1 AND state = 'in_progress' AND token = ?2";
constexpr std::string_view kDeleteClaim =
    "DELETE FROM idem_records WHERE key = ?1 AND state = 'in_progress' AND token = ?2";
constexpr std::string_view kRenew =
    "UPDATE idem_records SET lease_until_ms = ?3 "
    "WHERE key = ?1 AND state = 'in_progress' AND token = ?2";
// One chunk of purge_expired(): the partial index idem_records_expiry finds the expired rows
// from the oldest, and the rows deleted by earlier chunks are gone, so every chunk reads only
// what it deletes.
constexpr std::string_view kPurgeChunk =
    "DELETE FROM idem_records WHERE rowid IN (SELECT rowid FROM idem_records "
    "WHERE state = 'completed' AND expires_at_ms <= ?1 LIMIT ?2)";
constexpr std::int64_t kPurgeChunkRows = 1000;
constexpr std::string_view kCountByState =
    "SELECT "
    "coalesce(sum(state = 'in_progress' AND lease_until_ms > ?1), 0), "
    "coalesce(sum(state = 'in_progress' AND NOT lease_until_ms > ?1), 0), "
    "coalesce(sum(state = 'completed' AND expires_at_ms > ?1), 0), "
    "coalesce(sum(state = 'completed' AND NOT expires_at_ms > ?1), 0) "
    "FROM idem_records";
constexpr std::string_view kCount = "SELECT count(*) FROM idem_records";
// list(): the keys after the cursor (?1) from the prefix (?2) up to its successor (?3; NULL: no
// bound), in the primary key's byte order, one row more than the page (?4) to know whether
// another page follows. value and report are not read (NULL in their columns).
constexpr std::string_view kList =
    "SELECT state, token, fingerprint, lease_until_ms, completed_at_ms, expires_at_ms, NULL, "
    "NULL, key FROM idem_records WHERE key > ?1 AND key >= ?2 AND (?3 IS NULL OR key < ?3) "
    "ORDER BY key LIMIT ?4";
constexpr int kListKeyColumn = 8;
constexpr std::string_view kRemove = "DELETE FROM idem_records WHERE key = ?1 AND token = ?2";

// Columns of kSelectRecord.
enum Column : int {
  kState = 0,
  kToken,
  kFingerprint,
  kLeaseUntil,
  kCompletedAt,
  kExpiresAt,
  kValue,
  kReport,
};

// Deadlines are stored as milliseconds and returned as WallTime, whose nanosecond count
// overflows past this many milliseconds (year 2262).
constexpr std::int64_t kMaxMs =
    std::chrono::duration_cast<std::chrono::milliseconds>(WallTime::duration::max()).count();
constexpr std::int64_t kMinMs =
    std::chrono::duration_cast<std::chrono::milliseconds>(WallTime::duration::min()).count();

std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > kMaxMs - b) return kMaxMs;
  return a + b;
}

WallTime from_ms(std::int64_t ms) {
  return WallTime(std::chrono::milliseconds(std::clamp(ms, kMinMs, kMaxMs)));
}

std::int64_t to_ms(WallTime t) {
  return std::chrono::floor<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// Tokens are stored as SQLite's signed INTEGER; a larger one was never handed out.
bool token_fits(std::uint64_t token) {
  return token <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

std::string_view type_name(int type) {
  switch (type) {
    case SQLITE_INTEGER:
      return "INTEGER";
    case SQLITE_FLOAT:
      return "REAL";
    case SQLITE_TEXT:
      return "TEXT";
    case SQLITE_BLOB:
      return "BLOB";
    default:
      return "NULL";
  }
}

// Reads one row of kSelectRecord into a record, checking every column it needs: a row written by
// anything but this store (or damaged) becomes a clear error, never a half-read record.
class RecordDecoder {
 public:
  RecordDecoder(const Statement& row, std::string_view key, const std::string& path)
      : row_(row), key_(key), path_(path) {}

  // The record without its value and report (list()).
  IdempotencyRecord decode_summary() const { return decode(/*with_value=*/false); }

  // `with_report` false leaves a completed record's report empty: its column's type is checked,
  // its JSON not parsed (AsyncStore::claim_without_report).
  IdempotencyRecord decode(bool with_value = true, bool with_report = true) const {
    IdempotencyRecord record;
    record.key = std::string(key_);
    const std::string state = text(kState, "state");
    if (state == "in_progress") {
      record.state = IdempotencyRecord::State::in_progress;
    } else if (state == "completed") {
      record.state = IdempotencyRecord::State::completed;
    } else {
      corrupt("column state holds the unknown state '" + state.substr(0, 40) + "'");
    }
    const std::int64_t token = integer(kToken, "token");
    if (token <= 0) corrupt("column token holds " + std::to_string(token) + " (tokens are > 0)");
    record.token = static_cast<std::uint64_t>(token);
    if (!row_.column_is_null(kFingerprint)) record.fingerprint = text(kFingerprint, "fingerprint");
    if (record.state == IdempotencyRecord::State::in_progress) {
      record.lease_until = from_ms(integer(kLeaseUntil, "lease_until_ms"));
      return record;
    }
    record.completed_at = from_ms(integer(kCompletedAt, "completed_at_ms"));
    record.expires_at = from_ms(integer(kExpiresAt, "expires_at_ms"));
    if (!with_value) return record;
    const int value_type = row_.column_type(kValue);
    if (value_type != SQLITE_BLOB && value_type != SQLITE_TEXT) {
      corrupt("column value of a completed record holds " + std::string(type_name(value_type)) +
              " (expected the result's bytes as a BLOB)");
    }
    record.value.bytes = row_.column_blob(kValue);
    const int report_type = row_.column_type(kReport);
    if (report_type != SQLITE_TEXT && report_type != SQLITE_BLOB) {
      corrupt("column report of a completed record holds " + std::string(type_name(report_type)) +
              " (expected the execution report as JSON text)");
    }
    if (!with_report) return record;
    try {
      record.report = ExecutionReport::from_json(row_.column_blob(kReport));
    } catch (const std::exception& e) {
      corrupt("column report is not a readable execution report (" + std::string(e.what()) + ")");
    }
    return record;
  }

 private:
  std::int64_t integer(int column, std::string_view name) const {
    expect_type(column, name, SQLITE_INTEGER, "an INTEGER");
    return row_.column_int64(column);
  }

  std::string text(int column, std::string_view name) const {
    expect_type(column, name, SQLITE_TEXT, "TEXT");
    return row_.column_text(column);
  }

  // `column` (called `name`) must hold `type`, spelled `what` in the error.
  void expect_type(int column, std::string_view name, int type, std::string_view what) const {
    const int actual = row_.column_type(column);
    if (actual != type) {
      corrupt("column " + std::string(name) + " holds " + std::string(type_name(actual)) +
              " where " + std::string(what) + " must be");
    }
  }

  [[noreturn]] void corrupt(const std::string& why) const {
    throw StoreError(ErrorCode::store_corrupt_record,
                     "idempotency record '" + std::string(key_) + "' in '" + path_ +
                         "' (table idem_records) is corrupt: " + why +
                         "; delete the row to reset the key");
  }

  const Statement& row_;
  std::string_view key_;
  const std::string& path_;
};

// The smallest string greater than every string that starts with `prefix` (byte order), or
// nullopt when there is none (an empty prefix, or one of 0xff bytes only).
std::optional<std::string> prefix_successor(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff)
    end.pop_back();
  if (end.empty()) return std::nullopt;
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

// Neither an expired result nor a claim whose lease has ended: a claim must leave it alone.
bool is_live(const IdempotencyRecord& record, std::int64_t now_ms) {
  return record.state == IdempotencyRecord::State::completed ? to_ms(record.expires_at) > now_ms
                                                             : to_ms(record.lease_until) > now_ms;
}

}  // namespace

// ---- Impl -----------------------------------------------------------------------------------

class SqliteIdempotencyStore::Impl {
 public:
  Impl(std::string path, SqliteOptions options)
      : path_(std::move(path)), options_(std::move(options)) {}

  // The writer connection for one write, held for as long as the lock lives.
  class WriterLock {
   public:
    explicit WriterLock(Impl& impl)
        : connections_(impl.connections_), lock_(connections_.writer_mutex()) {}
    Connection& connection() { return connections_.writer(); }

   private:
    detail::ConnectionSet& connections_;
    std::lock_guard<std::mutex> lock_;
  };

  using Prefer = detail::ConnectionSet::Prefer;

  // The connection for one read (ConnectionSet::ReadLease).
  class ReadLease : public detail::ConnectionSet::ReadLease {
   public:
    explicit ReadLease(Impl& impl, Prefer prefer = Prefer::reader)
        : detail::ConnectionSet::ReadLease(impl.connections_, prefer) {}
  };

  void open() {
    detail::check_open_arguments(path_, options_);
    clock_ = options_.clock ? options_.clock : system_clock();
    connections_.open([this] { return check_schema(); }, [this] { create_schema(); });
  }

  std::int64_t now_ms() const { return to_ms(clock_->wall_now()); }

  // The record of `key` read on `connection`, nullopt when there is no row.
  std::optional<IdempotencyRecord> read(Connection& connection, std::string_view key,
                                        bool with_report = true) {
    Statement select = connection.prepare(kSelectRecord);
    select.bind(1, key);
    if (!select.step()) return std::nullopt;
    return RecordDecoder(select, key, path_).decode(/*with_value=*/true, with_report);
  }

  // The claim's answer when `key` has a live record on `connection`; nullopt otherwise.
  std::optional<ClaimOutcome> live_answer(Connection& connection, std::string_view key,
                                          std::optional<std::string_view> fingerprint,
                                          bool with_report) {
    const std::int64_t now = now_ms();
    std::optional<IdempotencyRecord> record;
    try {
      record = read(connection, key, with_report);
    } catch (const StoreError& e) {
      // A row it cannot read: the claim's own statement decides (a dead row is replaced, a live
      // one read again and reported).
      if (e.code() == ErrorCode::store_corrupt_record) return std::nullopt;
      throw;
    }
    if (!record || !is_live(*record, now)) return std::nullopt;
    return ClaimOutcome::found(std::move(*record), fingerprint);
  }

  // Runs `write` (statements on the writer connection) in a write transaction that concurrent
  // writes of this store share (group commit: the recorder's queue, GroupCommitQueue): returns
  // once that transaction committed, and throws what `write` threw or the commit's failure.
  // `write` must only assign its results, since it may run twice: when another write of the
  // batch throws, the transaction rolls back (nothing of it happened) and each write runs again
  // in a transaction of its own, so a failure is only its own write's.
  void grouped(const std::function<void(Connection&)>& write) {
    connections_.check_process();
    PendingWrite entry;
    entry.write = &write;
    writes_.run(entry, [this](std::size_t& taken) { write_queued(taken); });
  }

  // The committer's side of grouped(), for the caller at the front of the queue.
  void write_queued(std::size_t& taken) {
    std::vector<PendingWrite*> batch;
    const auto collect = [&] {
      writes_.collect(taken, [&](GroupCommitQueue::Entry* entry) {
        if (batch.size() >= kMaxGroupedWrites) return false;
        batch.push_back(static_cast<PendingWrite*>(entry));
        return true;
      });
    };
    collect();  // at least the caller's own write, so a failure fails it too
    WriterLock lock(*this);
    Connection& connection = lock.connection();
    {
      WriteTransaction tx(connection);
      bool failed = false;
      // Writes queued while the transaction is open join it.
      for (std::size_t i = 0; i < batch.size() && !failed; ++i) {
        try {
          (*batch[i]->write)(connection);
        } catch (...) {
          failed = true;
        }
        if (i + 1 == batch.size()) collect();
      }
      if (!failed) {
        tx.commit();
        return;
      }
    }
    for (PendingWrite* entry : batch) {
      try {
        WriteTransaction tx(connection);
        (*entry->write)(connection);
        tx.commit();
      } catch (...) {
        entry->error = std::current_exception();
      }
    }
  }

  std::string path_;
  SqliteOptions options_;
  std::shared_ptr<Clock> clock_;
  detail::ConnectionSet connections_{path_, options_};  // opened by open()

  // Group commit of claim, complete, release and renew (grouped()).
  struct PendingWrite : GroupCommitQueue::Entry {
    const std::function<void(Connection&)>* write = nullptr;
  };
  static constexpr std::size_t kMaxGroupedWrites = 64;
  GroupCommitQueue writes_;

 private:
  bool check_schema();
  void create_schema();
  void check_records_columns();
};

bool SqliteIdempotencyStore::Impl::check_schema() {
  // Only reads: a file refused here is left exactly as it was (ConnectionSet::open switches the
  // journal mode and creates tables only after this returned).
  int tables = 0;
  bool has_records = false;
  bool has_schema_table = false;
  {
    Statement select = connections_.writer().prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN "
        "('idem_records', 'idem_schema', 'idem_counters')");
    while (select.step()) {
      ++tables;
      const std::string name = select.column_text(0);
      if (name == "idem_records") has_records = true;
      if (name == "idem_schema") has_schema_table = true;
    }
  }
  if (has_records) check_records_columns();
  if (has_schema_table) {
    Statement version =
        connections_.writer().prepare("SELECT version FROM idem_schema WHERE component = 'store'");
    if (version.step() && version.column_int64(0) > kSchemaVersion) {
      throw SqliteError(ErrorCode::store_open_failed,
                        "'" + path_ + "' uses idem store schema version " +
                            std::to_string(version.column_int64(0)) +
                            ", newer than this idem understands (" +
                            std::to_string(kSchemaVersion) + "); upgrade idem",
                        SQLITE_ERROR, SQLITE_ERROR, false, false);
    }
  }
  if (tables < 3 && options_.read_only) {
    throw SqliteError(ErrorCode::store_read_only,
                      "'" + path_ +
                          "' has no idempotency store tables (idem_records, idem_schema, "
                          "idem_counters) and is opened read-only, so they cannot be created",
                      SQLITE_READONLY, SQLITE_READONLY, false, false);
  }
  if (tables < 3 && !options_.create_schema) {
    throw SqliteError(ErrorCode::store_error,
                      "the idempotency store's tables (idem_records, idem_schema, idem_counters) "
                      "do not exist in '" +
                          path_ + "', and create_schema is false",
                      SQLITE_ERROR, SQLITE_ERROR, false, false);
  }
  return tables < 3;
}

void SqliteIdempotencyStore::Impl::create_schema() {
  // One write transaction, so processes opening a new file at once create it exactly once.
  WriteTransaction tx(connections_.writer());
  connections_.writer().exec_script(kCreateStoreTables);
  tx.commit();
}

void SqliteIdempotencyStore::Impl::check_records_columns() {
  // An idem_records made by something else must still have every column this store reads.
  int columns = 0;
  {
    Statement info =
        connections_.writer().prepare("SELECT name FROM pragma_table_info('idem_records')");
    while (info.step()) {
      static constexpr std::string_view kNeeded[] = {
          "key",           "state", "token",  "fingerprint", "lease_until_ms", "completed_at_ms",
          "expires_at_ms", "value", "report", "took_over"};
      const std::string name = info.column_text(0);
      if (std::find(std::begin(kNeeded), std::end(kNeeded), name) != std::end(kNeeded)) ++columns;
    }
  }
  if (columns != 10) {
    throw SqliteError(ErrorCode::store_not_a_database,
                      "'" + path_ +
                          "' has an idem_records table without the columns the idempotency "
                          "store uses (key, state, token, fingerprint, lease_until_ms, "
                          "completed_at_ms, expires_at_ms, value, report, took_over)",
                      SQLITE_ERROR, SQLITE_ERROR, false, false);
  }
}

// ---- SqliteIdempotencyStore -----------------------------------------------------------------

SqliteIdempotencyStore::SqliteIdempotencyStore(std::string path, SqliteOptions options)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(options))) {
  impl_->open();
  wait_clock_ = impl_->clock_;
}

SqliteIdempotencyStore::~SqliteIdempotencyStore() = default;

const std::string& SqliteIdempotencyStore::path() const noexcept {
  return impl_->path_;
}

const SqliteOptions& SqliteIdempotencyStore::options() const noexcept {
  return impl_->options_;
}

ClaimOutcome SqliteIdempotencyStore::claim_without_report(
    std::string_view key, std::optional<std::string_view> fingerprint, Millis lease) {
  ::idem::detail::check_idempotency_key(key);
  ::idem::detail::check_lease(lease);
  return claim_record(key, fingerprint, lease, /*with_report=*/false);
}

ClaimOutcome SqliteIdempotencyStore::do_claim(std::string_view key,
                                              std::optional<std::string_view> fingerprint,
                                              Millis lease) {
  return claim_record(key, fingerprint, lease, /*with_report=*/true);
}

ClaimOutcome SqliteIdempotencyStore::claim_record(std::string_view key,
                                                  std::optional<std::string_view> fingerprint,
                                                  Millis lease, bool with_report) {
  // Fast path without the file's write lock: a live record stays live until its expiry or
  // lease end, so an answer read from a snapshot taken during this call is the answer of that
  // moment. Replays and in-progress duplicates then never queue behind writers, in this process
  // or another. The read goes to the writer connection when it is idle (its page cache is warm),
  // else to a pooled reader. ":memory:" has one connection: the claim below reads it anyway.
  if (!impl_->connections_.in_memory()) {
    std::unique_lock writer_lock(impl_->connections_.writer_mutex(), std::try_to_lock);
    if (writer_lock.owns_lock()) {
      if (auto answer =
              impl_->live_answer(impl_->connections_.writer(), key, fingerprint, with_report))
        return *answer;
    } else {
      Impl::ReadLease lease_for_read(*impl_);
      if (auto answer =
              impl_->live_answer(lease_for_read.connection(), key, fingerprint, with_report)) {
        return *answer;
      }
    }
  }
  // No live record was seen: claim in a write transaction (shared with concurrent writes).
  ClaimOutcome outcome;
  std::optional<IdempotencyRecord> record;
  const std::function<void(Connection&)> write = [&](Connection& connection) {
    outcome = ClaimOutcome();
    record.reset();
    const std::int64_t now = impl_->now_ms();
    {
      Statement claim = connection.prepare(kClaim);
      claim.bind(1, key);
      if (fingerprint) {
        claim.bind(2, *fingerprint);
      } else {
        claim.bind_null(2);
      }
      claim.bind(3, saturating_add(now, lease.count())).bind(4, now);
      if (claim.step()) {
        outcome.status = ClaimOutcome::Status::acquired;
        const std::int64_t token = claim.column_int64(0);
        outcome.token = static_cast<std::uint64_t>(token);
        outcome.took_over = claim.column_int64(1) != 0;
        while (claim.step()) {
        }
        Statement advance = connection.prepare(kAdvanceCounter);
        advance.bind(1, token);
        if (advance.run() != 1) {
          // Rolled back with the transaction: without the counter, tokens could repeat.
          throw StoreError(ErrorCode::store_corrupt_record,
                           "the claim_token row of idem_counters in '" + impl_->path_ +
                               "' is missing; restore it with a value at least the largest "
                               "token in idem_records and idem_claims");
        }
        return;
      }
    }
    // A live record: read it in the same transaction, so the answer is the record that refused
    // us (nothing written).
    record = impl_->read(connection, key, with_report);
    if (!record) {
      throw StoreError("claim of idempotency key '" + std::string(key) + "' in '" + impl_->path_ +
                       "' neither claimed it nor found its record");
    }
  };
  impl_->grouped(write);
  if (!record) return outcome;
  return ClaimOutcome::found(std::move(*record), fingerprint);
}

bool SqliteIdempotencyStore::do_complete(std::string_view key, std::uint64_t token,
                                         StoredValue value, const ExecutionReport& report,
                                         Millis ttl) {
  if (!token_fits(token)) return false;
  const auto stored_token = static_cast<std::int64_t>(token);
  // Serialised before the write lock is taken: the lock is shared by every process.
  const std::string report_json = ttl == Millis::zero() ? std::string() : report.to_json();
  const std::string_view bytes = value.bytes ? std::string_view(*value.bytes) : std::string_view();
  std::int64_t changed = 0;  // 0: fenced off, completed already, or never claimed
  const std::function<void(Connection&)> write = [&](Connection& connection) {
    if (ttl == Millis::zero()) {
      // Expired the instant it completes: nothing to keep.
      Statement drop = connection.prepare(kDeleteClaim);
      drop.bind(1, key).bind(2, stored_token);
      changed = drop.run();
    } else {
      const std::int64_t now = impl_->now_ms();
      Statement update = connection.prepare(kComplete);
      update.bind(1, key)
          .bind(2, stored_token)
          .bind(3, now)
          .bind(4, saturating_add(now, ttl.count()))
          .bind(5, SqlParam::blob(bytes))
          .bind(6, std::string_view(report_json));
      changed = update.run();
    }
  };
  impl_->grouped(write);
  return changed != 0;
}

bool SqliteIdempotencyStore::do_release(std::string_view key, std::uint64_t token) {
  if (!token_fits(token)) return false;
  std::int64_t changed = 0;
  const std::function<void(Connection&)> write = [&](Connection& connection) {
    Statement drop = connection.prepare(kDeleteClaim);
    drop.bind(1, key).bind(2, static_cast<std::int64_t>(token));
    changed = drop.run();
  };
  impl_->grouped(write);
  return changed != 0;
}

bool SqliteIdempotencyStore::do_renew(std::string_view key, std::uint64_t token, Millis lease) {
  if (!token_fits(token)) return false;
  std::int64_t changed = 0;
  const std::function<void(Connection&)> write = [&](Connection& connection) {
    Statement update = connection.prepare(kRenew);
    update.bind(1, key)
        .bind(2, static_cast<std::int64_t>(token))
        .bind(3, saturating_add(impl_->now_ms(), lease.count()));
    changed = update.run();
  };
  impl_->grouped(write);
  return changed != 0;
}

std::optional<IdempotencyRecord> SqliteIdempotencyStore::do_lookup(std::string_view key) {
  Impl::ReadLease lease(*impl_, Impl::Prefer::idle_writer);
  auto record = impl_->read(lease.connection(), key);
  if (record && record->state == IdempotencyRecord::State::completed &&
      to_ms(impl_->clock_->wall_now()) >= to_ms(record->expires_at)) {
    return std::nullopt;  // expired: absent to every reader, whether purged yet or not
  }
  return record;
}

std::size_t SqliteIdempotencyStore::do_purge_expired(const PurgeProgress& progress) {
  // One instant for the whole purge: results that expire while it runs wait for the next one.
  const std::int64_t now = impl_->now_ms();
  std::size_t purged = 0;
  for (;;) {
    std::int64_t removed = 0;
    {
      Impl::WriterLock lock(*impl_);
      Connection& connection = lock.connection();
      WriteTransaction tx(connection);
      Statement purge = connection.prepare(kPurgeChunk);
      purge.bind(1, now).bind(2, kPurgeChunkRows);
      removed = purge.run();
      tx.commit();
    }
    purged += static_cast<std::size_t>(removed);
    if (removed > 0 && progress) progress(purged);  // outside the write lock
    if (removed < kPurgeChunkRows) return purged;
  }
}

StoreCounts SqliteIdempotencyStore::do_counts() {
  Impl::ReadLease lease(*impl_);
  Statement count = lease.connection().prepare(kCountByState);
  count.bind(1, impl_->now_ms());
  StoreCounts counts;
  if (count.step()) {
    counts.in_progress = static_cast<std::uint64_t>(count.column_int64(0));
    counts.abandoned = static_cast<std::uint64_t>(count.column_int64(1));
    counts.completed = static_cast<std::uint64_t>(count.column_int64(2));
    counts.expired = static_cast<std::uint64_t>(count.column_int64(3));
  }
  return counts;
}

RecordPage SqliteIdempotencyStore::do_list(std::string_view prefix, std::size_t limit,
                                           std::string_view cursor) {
  const std::optional<std::string> end = prefix_successor(prefix);
  Impl::ReadLease lease(*impl_);
  Statement list = lease.connection().prepare(kList);
  list.bind(1, cursor).bind(2, prefix);
  if (end) {
    list.bind(3, std::string_view(*end));
  } else {
    list.bind_null(3);
  }
  list.bind(4, static_cast<std::int64_t>(limit) + 1);
  RecordPage page;
  while (list.step()) {
    if (page.records.size() == limit) {
      page.next = page.records.back().key;
      break;
    }
    const std::string key = list.column_blob(kListKeyColumn);
    page.records.push_back(RecordDecoder(list, key, impl_->path_).decode_summary());
  }
  return page;
}

bool SqliteIdempotencyStore::do_remove(std::string_view key, std::uint64_t token) {
  if (!token_fits(token)) return false;
  Impl::WriterLock lock(*impl_);
  Connection& connection = lock.connection();
  WriteTransaction tx(connection);
  Statement drop = connection.prepare(kRemove);
  drop.bind(1, key).bind(2, static_cast<std::int64_t>(token));
  if (drop.run() == 0) return false;
  tx.commit();
  return true;
}

std::size_t SqliteIdempotencyStore::do_entry_count() {
  Impl::ReadLease lease(*impl_);
  Statement count = lease.connection().prepare(kCount);
  return count.step() ? static_cast<std::size_t>(count.column_int64(0)) : 0;
}

}  // namespace idem::sqlite
