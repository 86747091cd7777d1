#include "idem/sqlite/sqlite_outbox.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>

#include "connection.hpp"
#include "idem/detail/fork.hpp"

namespace idem::sqlite {

using detail::Connection;
using detail::Statement;
using detail::WriteTransaction;

namespace {

constexpr const char* kCreateOutbox = R"sql(
CREATE TABLE IF NOT EXISTS idem_outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  consumer TEXT NOT NULL,
  source_event_id TEXT NOT NULL,
  event_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  payload BLOB NOT NULL,
  headers TEXT NOT NULL,
  event_ts_ms INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  last_error TEXT,
  parked_ms INTEGER
);
CREATE INDEX IF NOT EXISTS idem_outbox_parked ON idem_outbox(parked_ms, seq);
)sql";

constexpr std::string_view kInsert =
    "INSERT INTO idem_outbox(consumer, source_event_id, event_id, event_type, payload, headers, "
    "event_ts_ms, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
constexpr std::string_view kColumns =
    "seq, consumer, source_event_id, event_id, event_type, payload, headers, event_ts_ms, "
    "created_ms, attempts, last_error";

std::int64_t to_ms(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
WallTime from_ms(std::int64_t ms) {
  return WallTime(std::chrono::duration_cast<WallTime::duration>(std::chrono::milliseconds(ms)));
}

std::string encode_headers(const std::map<std::string, std::string>& headers) {
  return nlohmann::json(headers).dump();
}

std::map<std::string, std::string> decode_headers(const std::string& text) {
  try {
    return nlohmann::json::parse(text).get<std::map<std::string, std::string>>();
  } catch (const std::exception&) {
    return {};  // not written by idem: the event goes without headers rather than not at all
  }
}

OutboxRow read_row(const Statement& select) {
  OutboxRow row;
  row.seq = select.column_int64(0);
  row.consumer = select.column_text(1);
  row.source_event_id = select.column_text(2);
  row.event.id = select.column_text(3);
  row.event.type = select.column_text(4);
  row.event.payload = select.column_blob(5);
  row.event.headers = decode_headers(select.column_text(6));
  row.event.timestamp = from_ms(select.column_int64(7));
  row.created_at = from_ms(select.column_int64(8));
  row.attempts = static_cast<int>(select.column_int64(9));
  if (!select.column_is_null(10)) row.last_error = select.column_text(10);
  return row;
}

// An exclusive flock() on a file next to the database, held by one relay at a time.
class RelayLock {
 public:
  explicit RelayLock(const std::string& path) : path_(path) {}
  ~RelayLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  RelayLock(const RelayLock&) = delete;
  RelayLock& operator=(const RelayLock&) = delete;

  // True when acquired; false when another relay holds it.
  bool try_lock() {
    if (fd_ < 0) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) {
        throw StoreError(
            ErrorCode::store_open_failed,
            "cannot open the outbox relay lock '" + path_ + "': " + std::strerror(errno),
            /*retryable=*/false);
      }
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno == EWOULDBLOCK || errno == EINTR) return false;
    throw StoreError(ErrorCode::store_error, "cannot lock '" + path_ + "': " + std::strerror(errno),
                     /*retryable=*/true);
  }
  void unlock() noexcept {
    if (fd_ >= 0) ::flock(fd_, LOCK_UN);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

class SqliteOutbox::Impl {
 public:
  Impl(std::string path, SqliteOptions options)
      : path_(std::move(path)), options_(std::move(options)), relay_lock_(path_ + "-outbox.lock") {
    detail::check_open_arguments(path_, options_);
    if (path_ == ":memory:") {
      throw InvalidArgument(
          "SqliteOutbox needs a database file shared with the recorder (\":memory:\" is private "
          "to one connection)");
    }
    connection_ = detail::open_writer(path_, options_);
    if (!options_.read_only) {
      // Run again while another connection's lock is in the way (see retry_while_busy): the
      // journal-mode switch does not wait in the busy handler.
      detail::retry_while_busy(options_.busy_timeout, [&] {
        detail::use_wal(*connection_);
        if (options_.create_schema) connection_->exec_script(kCreateOutbox);
      });
    }
  }

  void check_process() const { process_.use("this SqliteOutbox"); }

  // Holds the relay lock (this process's mutex and the file lock) from take to destruction; a
  // busy batch holds neither (another thread's pass may hold the file lock through this same
  // descriptor, so only the holder unlocks it).
  class Batch final : public OutboxBatch {
   public:
    Batch(Impl& impl, std::unique_lock<std::mutex> relay) : impl_(impl), relay_(std::move(relay)) {}
    ~Batch() override {
      if (relay_.owns_lock()) impl_.relay_lock_.unlock();
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    void settle(std::span<const std::int64_t> confirmed,
                std::span<const Refusal> refused) override {
      std::lock_guard lock(impl_.mutex_);
      Connection& connection = *impl_.connection_;
      WriteTransaction tx(connection);
      for (const std::int64_t seq : confirmed) {
        Statement drop = connection.prepare("DELETE FROM idem_outbox WHERE seq = ?1");
        drop.bind(1, seq);
        drop.run();
      }
      const std::int64_t now = to_ms(std::chrono::system_clock::now());
      for (const Refusal& refusal : refused) {
        Statement update = connection.prepare(
            "UPDATE idem_outbox SET attempts = attempts + 1, last_error = ?2, parked_ms = ?3 "
            "WHERE seq = ?1");
        update.bind(1, refusal.seq).bind(2, std::string_view(refusal.reason));
        if (refusal.park) {
          update.bind(3, now);
        } else {
          update.bind_null(3);
        }
        update.run();
      }
      tx.commit();
    }

   private:
    Impl& impl_;
    std::unique_lock<std::mutex> relay_;
  };

  std::string path_;
  SqliteOptions options_;
  ::idem::detail::ForkOwner process_;
  std::mutex mutex_;  // guards connection_
  std::unique_ptr<Connection> connection_;
  std::mutex relay_mutex_;  // one relay pass at a time in this process (flock is per descriptor)
  RelayLock relay_lock_;    // and across processes
};

SqliteOutbox::SqliteOutbox(std::string path, SqliteOptions options)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(options))) {}

SqliteOutbox::~SqliteOutbox() = default;

const std::string& SqliteOutbox::path() const noexcept {
  return impl_->path_;
}

void SqliteOutbox::do_append(SqlTransaction& tx, std::string_view consumer,
                             std::string_view source_event_id, const Event& event) {
  const std::string headers = encode_headers(event.headers);
  const std::int64_t now = to_ms(std::chrono::system_clock::now());
  tx.exec(kInsert, {consumer, source_event_id, event.id, event.type, SqlParam::blob(event.payload),
                    headers, to_ms(event.timestamp), now});
}

std::unique_ptr<OutboxBatch> SqliteOutbox::do_take(std::size_t max_rows) {
  impl_->check_process();
  std::unique_lock relay(impl_->relay_mutex_, std::try_to_lock);
  if (!relay.owns_lock() || !impl_->relay_lock_.try_lock()) {
    auto busy = std::make_unique<Impl::Batch>(*impl_, std::unique_lock<std::mutex>());
    busy->busy = true;
    return busy;
  }
  auto batch = std::make_unique<Impl::Batch>(*impl_, std::move(relay));
  std::lock_guard lock(impl_->mutex_);
  Statement select = impl_->connection_->prepare(
      "SELECT " + std::string(kColumns) +
      " FROM idem_outbox WHERE parked_ms IS NULL ORDER BY seq LIMIT ?1");
  select.bind(1, static_cast<std::int64_t>(max_rows));
  while (select.step())
    batch->rows.push_back(read_row(select));
  return batch;
}

OutboxStats SqliteOutbox::do_stats() {
  impl_->check_process();
  std::lock_guard lock(impl_->mutex_);
  OutboxStats stats;
  Statement select = impl_->connection_->prepare(
      "SELECT count(*) FILTER (WHERE parked_ms IS NULL), count(*) FILTER (WHERE parked_ms IS NOT "
      "NULL), min(created_ms) FILTER (WHERE parked_ms IS NULL) FROM idem_outbox");
  if (select.step()) {
    stats.depth = static_cast<std::uint64_t>(select.column_int64(0));
    stats.parked = static_cast<std::uint64_t>(select.column_int64(1));
    if (!select.column_is_null(2)) {
      const std::int64_t age = to_ms(std::chrono::system_clock::now()) - select.column_int64(2);
      stats.oldest_age = std::chrono::milliseconds(std::max<std::int64_t>(age, 0));
    }
  }
  return stats;
}

std::vector<OutboxRow> SqliteOutbox::do_parked(std::size_t limit) {
  impl_->check_process();
  std::lock_guard lock(impl_->mutex_);
  std::vector<OutboxRow> rows;
  Statement select = impl_->connection_->prepare(
      "SELECT " + std::string(kColumns) +
      " FROM idem_outbox WHERE parked_ms IS NOT NULL ORDER BY seq LIMIT ?1");
  select.bind(1, static_cast<std::int64_t>(limit));
  while (select.step())
    rows.push_back(read_row(select));
  return rows;
}

std::size_t SqliteOutbox::do_unpark() {
  impl_->check_process();
  std::lock_guard lock(impl_->mutex_);
  WriteTransaction tx(*impl_->connection_);
  Statement update = impl_->connection_->prepare(
      "UPDATE idem_outbox SET parked_ms = NULL, attempts = 0 WHERE parked_ms IS NOT NULL");
  const auto changed = static_cast<std::size_t>(update.run());
  tx.commit();
  return changed;
}

}  // namespace idem::sqlite
