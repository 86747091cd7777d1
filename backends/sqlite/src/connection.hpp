// Internal RAII over the SQLite C API: a connection with a prepared-statement cache, a statement
// in use, and a write transaction that rolls back unless committed. Not installed.
//
// Thread-safety: a Connection (and everything borrowed from it) is used by one thread at a
// time; the recorder's locks guarantee that.
#pragma once

#include <sqlite3.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/detail/fork.hpp"
#include "idem/sqlite/sqlite_error.hpp"
#include "idem/sqlite/sqlite_options.hpp"
#include "idem/sqlite/sqlite_transaction.hpp"

namespace idem::sqlite::detail {

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* stmt) const noexcept { sqlite3_finalize(stmt); }
};
using DbHandle = std::unique_ptr<sqlite3, DbCloser>;
using StatementHandle = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

// Where an error happened decides whether its outcome is in doubt (see sqlite_error.hpp).
enum class Phase { other, commit };

// The SqliteError for result code `rc` (mapping in sqlite_error.cpp), with SQLite's message for
// the last failure on `db`; `db` may be null (then only the code's generic text is used). Build
// it before anything else runs on `db`, which would overwrite that message.
SqliteError make_sqlite_error(sqlite3* db, int rc, std::string_view action, std::string_view path,
                              Phase phase = Phase::other);
[[noreturn]] void throw_sqlite_error(sqlite3* db, int rc, std::string_view action,
                                     std::string_view path, Phase phase = Phase::other);

class Connection;

// A cached prepared statement borrowed for one execution: parameters are bound by index
// (1-based), and the destructor resets it and clears the bindings so the next user starts
// clean. Text is bound without copying (SQLITE_STATIC): it must outlive the Statement.
class Statement {
 public:
  // `owned` is set for a statement that is not cached: it is finalized with the Statement.
  Statement(Connection& connection, sqlite3_stmt* stmt, StatementHandle owned = {}) noexcept
      : connection_(&connection), stmt_(stmt), owned_(std::move(owned)) {}
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, std::string_view text);
  Statement& bind_null(int index);
  Statement& bind(int index, const SqlParam& param);
  int parameter_count() const noexcept;

  // Steps once and returns SQLite's result code as is (for callers that map it themselves).
  int step_code() noexcept;
  // Steps once: true when a row is ready, false when the statement is done. Throws on error.
  bool step();
  // Steps to the end and returns sqlite3_changes() of the connection.
  std::int64_t run();

  bool column_is_null(int column) const noexcept;
  // The storage class of a column of the current row: SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT,
  // SQLITE_BLOB or SQLITE_NULL. Ask before reading the column (reading may convert it).
  int column_type(int column) const noexcept;
  std::int64_t column_int64(int column) const noexcept;
  std::string column_text(int column) const;
  // The column's bytes as stored (a BLOB, or the bytes of a TEXT), NULs included.
  std::string column_blob(int column) const;

 private:
  Connection* connection_;
  sqlite3_stmt* stmt_;
  StatementHandle owned_;
};

class Connection {
 public:
  // Opens `path` (a file or ":memory:"), sets the busy handler, extended result codes and, for
  // a writer, PRAGMA synchronous. `create` adds SQLITE_OPEN_CREATE; `read_only` opens with
  // SQLITE_OPEN_READONLY.
  Connection(const std::string& path, const SqliteOptions& options, bool create, bool read_only);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  sqlite3* db() const noexcept { return db_.get(); }
  const std::string& path() const noexcept { return path_; }

  // A statement prepared once per connection and cached by its text. Throws SqliteError when
  // it does not compile, InvalidArgument when `sql` holds more than one statement.
  Statement prepare(std::string_view sql);

  // Runs SQL text without caching (pragmas, DDL); calls `row` for each row's first column.
  void exec_script(const char* sql,
                   const std::function<void(std::string_view first_column)>& row = {});

  [[noreturn]] void fail(int rc, std::string_view action, Phase phase = Phase::other) const;

  // Throws SqliteError(store_replaced) when the file at path() is no longer the file this
  // connection has open: deleted, or another file renamed over it (SQLite's
  // SQLITE_FCNTL_HAS_MOVED: a stat() of the path against the open file's inode). Writes would
  // then go to a file no other process opens. The stat() costs microseconds on a VM, as much as
  // a tenth of a mark, so it runs at most once per kReplacementCheckInterval of the options'
  // clock (steady time); the first call always checks. Once replaced, always replaced: every
  // later call throws at once. A no-op for ":memory:". `action` names what was refused.
  static constexpr std::chrono::milliseconds kReplacementCheckInterval{1};
  void check_file_not_replaced(std::string_view action);

 private:
  static int on_busy(void* self, int attempts) noexcept;

  struct TransparentHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  std::string path_;
  std::shared_ptr<Clock> clock_;  // steady time for check_file_not_replaced()
  std::optional<SteadyTime> last_replacement_check_;
  std::string replaced_;  // once found replaced, why: every later write is refused at once
  std::chrono::milliseconds busy_timeout_;
  std::chrono::steady_clock::time_point busy_deadline_{};
  DbHandle db_;
  std::unordered_map<std::string, StatementHandle, TransparentHash, std::equal_to<>> cache_;
};

// The busy handler's wait, shared with retry_while_busy: false once `deadline` has passed;
// otherwise yields (the first two attempts) or sleeps an exponentially growing delay (10 us to
// 2 ms, never past the deadline) and returns true.
bool wait_for_lock(std::chrono::steady_clock::time_point deadline, int attempts) noexcept;

// Runs `step`, and runs it again while it throws a store_busy SqliteError, for at most `timeout`
// in all; then the last error is thrown. For the steps of opening a file: SQLite answers some of
// them with SQLITE_BUSY without calling the busy handler, above all a journal-mode change while
// another connection holds a lock (sqlite3_busy_handler: waiting there could deadlock), so the
// busy timeout alone would not let them wait. `step` must be safe to run again after it failed.
void retry_while_busy(std::chrono::milliseconds timeout, const std::function<void()>& step);

// What every SQLite component checks before it opens `path` with `options`: InvalidArgument for
// an empty path or a NUL byte in it, ConfigError for bad options or a libsqlite3 built without
// thread support.
void check_open_arguments(const std::string& path, const SqliteOptions& options);

// Opens the writer connection of `path` (creating the file unless options.read_only or
// !options.create_schema), explains a failed open (missing directory, a directory, no file where
// none may be created) and sets PRAGMA synchronous from options.durability. Writes nothing to the
// file: the journal mode is switched later (use_wal), once the schema check has accepted the
// file. Throws SqliteError.
std::unique_ptr<Connection> open_writer(const std::string& path, const SqliteOptions& options);

// Switches the file to WAL (what lets processes share it); throws store_open_failed when SQLite
// refuses (some network file systems).
void use_wal(Connection& writer);

// The file's journal mode as SQLite names it ("wal", "delete", "memory", ...); changes nothing.
std::string journal_mode(Connection& connection);

// True when the database of `connection` has a table named `name`.
bool has_table(Connection& connection, std::string_view name);

// Runs the WAL checkpoints of one writer connection on a thread of its own, so a commit never
// waits for one. SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL past
// 1,000 pages: it copies the WAL into the database and fsyncs both (at durability normal and
// full), all on the committing thread; with random event ids that was half of every mark's time
// (DESIGN-NOTES §30). This object replaces it: the writer's WAL hook asks the thread for a
// PASSIVE checkpoint (one that never waits for, nor blocks, readers and writers) once the WAL
// holds kWakePages pages that no checkpoint has copied yet. Counting only the uncopied pages
// matters: a PASSIVE checkpoint lets the next commit restart the WAL from the beginning only
// when it copied every frame, which under a steady stream of commits it rarely does (new frames
// arrive while it copies), so the WAL's total size stays past the threshold; asking on total
// size then ran a checkpoint, with its two fsyncs, after nearly every commit (DESIGN-NOTES §32).
// So after each of the thread's checkpoints, once the frames committed while it ran number at
// most kTailPages, the committing thread copies them itself (one small PASSIVE checkpoint, once per
// background checkpoint): every frame is then copied and the next commit restarts the WAL from
// its beginning. The WAL stays near kWakePages pages and commits overwrite a file of that size
// rather than extend it, which matters at durability full: an fdatasync that grows the file also
// commits its size, about doubling the cost of a mark (DESIGN-NOTES §63). Under a stream of
// commits faster than the thread (more than kTailPages frames arrive while it copies), the
// committing thread's fallback bounds the file: when it holds kInlinePages, that thread
// checkpoints as SQLite would have.
//
// Owned next to the writer and destroyed before it (the hook points here). The destructor stops
// the thread and hands the writer back to SQLite's automatic checkpoints. Failed checkpoints are
// not reported: none loses data (the WAL keeps every frame until one succeeds), as with
// SQLite's own automatic checkpoint.
class Checkpointer {
 public:
  static constexpr int kWakePages = 1000;  // SQLite's own default (wal_autocheckpoint)
  static constexpr int kInlinePages = 8 * kWakePages;
  static constexpr int kTailPages = 256;

  // Opens its own connection to `path` and takes over `writer`'s automatic checkpoints.
  // Throws SqliteError when the connection cannot be opened.
  Checkpointer(Connection& writer, const std::string& path, const SqliteOptions& options);
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;
  ~Checkpointer();

  // Checkpoints the background thread has run (tests read it).
  std::uint64_t checkpoints() const;
  // Waits until the thread has run at least `count` checkpoints, or `timeout` has passed;
  // returns checkpoints().
  std::uint64_t wait_for_checkpoints(std::uint64_t count, std::chrono::milliseconds timeout) const;

 private:
  static int on_commit(void* self, sqlite3* db, const char* schema, int wal_pages) noexcept;
  void run();

  Connection& writer_;
  Connection connection_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  mutable std::condition_variable checkpointed_;  // after each of the thread's checkpoints
  bool requested_ = false;                        // guarded by mutex_
  bool stopping_ = false;                         // guarded by mutex_
  std::uint64_t checkpoints_ = 0;                 // guarded by mutex_
  std::atomic<int> copied_pages_{0};              // WAL frames the last checkpoint had copied
  std::atomic<std::uint64_t> finished_{0};        // the thread's checkpoints, counted lock-free
  int last_wal_pages_ = 0;  // the WAL's size at the last commit (writer's thread)
  // finished_ when the writer last copied the tail (writer's thread)
  std::uint64_t tail_after_ = 0;
  std::thread thread_;  // started last, once connection_ is ready
};

// A Checkpointer for `writer` when its file has a WAL (not ":memory:", not read_only); else null.
std::unique_ptr<Checkpointer> start_checkpointer(Connection& writer, const std::string& path,
                                                 const SqliteOptions& options);

// The connections a recorder or a store keeps to its file: one writer, used by one thread at a
// time under writer_mutex(); the writer's Checkpointer; and a pool of reader connections, opened
// on demand and kept up to SqliteOptions::max_idle_readers. ":memory:" has the writer only (a
// second connection would see another, empty database).
class ConnectionSet {
 public:
  ConnectionSet(std::string path, SqliteOptions options)
      : path_(std::move(path)), options_(std::move(options)), in_memory_(path_ == ":memory:") {}
  ConnectionSet(const ConnectionSet&) = delete;
  ConnectionSet& operator=(const ConnectionSet&) = delete;

  // Opens the writer (open_writer) and runs `check_schema`, which only reads (through writer())
  // and throws for a file it refuses, so a refused file is left exactly as it was; it returns
  // true when tables are missing. Then, when the options allow writing the schema (not
  // read_only, create_schema), switches the file to WAL and runs `create_schema`, which creates
  // the missing tables. Starts the checkpoint thread when the file is in WAL mode. Throws
  // SqliteError (or what the callbacks throw).
  void open(const std::function<bool()>& check_schema, const std::function<void()>& create_schema);

  const std::string& path() const noexcept { return path_; }
  const SqliteOptions& options() const noexcept { return options_; }
  bool in_memory() const noexcept { return in_memory_; }
  // The writer's mutex; ConfigError in a child of fork() (these connections are the parent's).
  std::mutex& writer_mutex() {
    check_process();
    return writer_mutex_;
  }
  void check_process() const { process_.use("this SQLite recorder or store"); }
  // The writer; use it only while holding writer_mutex() (or as the thread that holds it).
  Connection& writer() noexcept { return *writer_; }

  // Where a read goes besides the cases every read shares (see ReadLease).
  enum class Prefer {
    reader,       // a pooled reader: scans and counts, which would hold up the writer
    idle_writer,  // the writer when no thread holds it: point lookups
  };

  // The connection for one read:
  //   * the writer, unlocked, when the calling thread already holds it (`holds_writer`: a
  //     handler inside a write sees its own transaction);
  //   * for ":memory:" the only connection, under its lock;
  //   * with Prefer::idle_writer the writer when no thread holds it (its page cache stays warm,
  //     whereas a reader's is dropped whenever the file changed: DESIGN-NOTES §30);
  //   * otherwise a pooled reader.
  // Apart from ":memory:", a read never waits for this process's writer (WAL: nor for other
  // processes' writers).
  class ReadLease {
   public:
    explicit ReadLease(ConnectionSet& set, Prefer prefer = Prefer::reader,
                       bool holds_writer = false);
    ReadLease(const ReadLease&) = delete;
    ReadLease& operator=(const ReadLease&) = delete;
    ~ReadLease();

    Connection& connection() noexcept { return *connection_; }

   private:
    ConnectionSet& set_;
    Connection* connection_ = nullptr;
    std::unique_lock<std::mutex> writer_lock_;
    std::unique_ptr<Connection> reader_;
  };

 private:
  std::unique_ptr<Connection> take_reader();
  void return_reader(std::unique_ptr<Connection> reader) noexcept;

  const std::string path_;
  const SqliteOptions options_;
  const bool in_memory_;
  const ::idem::detail::ForkOwner process_;
  std::mutex writer_mutex_;
  std::unique_ptr<Connection> writer_;
  // Declared after writer_, so it stops (and unhooks itself) before the writer closes.
  std::unique_ptr<Checkpointer> checkpointer_;
  std::mutex readers_mutex_;
  std::vector<std::unique_ptr<Connection>> idle_readers_;  // guarded by readers_mutex_
};

// Group commit (LevelDB's writer queue), shared by the recorder's marks and the store's writes:
// a caller queues an Entry and waits; the caller at the front of the queue runs `commit_front`,
// which commits one transaction holding its own entry and entries queued behind it, and then
// wakes those. Entries that queue up while the transaction is open may still join it (collect()
// from the transaction's loop). Only the committing thread pops entries, so positions in the
// queue stay valid while it works. Waiters park on a pool of condition variables that outlive
// every waiter, so the committer notifies after releasing the queue's mutex: a woken waiter
// then finds the mutex free instead of going back to sleep on it (on 2 cores that halved the
// context switches per mark).
class GroupCommitQueue {
 public:
  struct Entry {
    bool done = false;
    // Set by commit_front for this entry alone, or by run() for every entry its commit held
    // when commit_front threw.
    std::exception_ptr error;
    std::condition_variable* cv = nullptr;  // borrowed from the queue's pool
  };

  // Queues `entry` and returns once a transaction holding it has ended (this thread's, when it
  // reaches the front, or another caller's); rethrows entry.error. `commit_front(taken)` runs
  // without the queue's lock; `taken` counts the queue's leading entries its transaction held
  // (collect() advances it), at least one once it collected. When it throws, every entry it
  // took gets that error.
  void run(Entry& entry, const std::function<void(std::size_t& taken)>& commit_front);

  // Under the queue's lock: offers the entries from position `taken` on to `take(entry)` while
  // it returns true, counting each taken entry in `taken`.
  template <class Take>
  void collect(std::size_t& taken, Take&& take) {
    std::lock_guard lock(mutex_);
    while (taken < queue_.size() && take(queue_[taken]))
      ++taken;
  }

  // Entries waiting or being committed.
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return queue_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::deque<Entry*> queue_;
  std::array<std::condition_variable, 16> cvs_;  // chosen round-robin
  std::size_t next_cv_ = 0;                      // guarded by mutex_
};

// BEGIN IMMEDIATE in the constructor (taking the database's write lock, waiting up to the busy
// timeout); ROLLBACK in the destructor unless commit() succeeded. Both the constructor (once it
// holds the lock) and commit() (before COMMIT) check that the file was not replaced
// (Connection::check_file_not_replaced, at most once per millisecond), so nothing commits into a
// file deleted or replaced longer ago than that.
class WriteTransaction {
 public:
  explicit WriteTransaction(Connection& connection);
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;
  ~WriteTransaction();

  // COMMIT. On failure the transaction is rolled back (when SQLite has not already) and a
  // SqliteError is thrown: BUSY/LOCKED are retryable and certainly not committed; a failure
  // after which SQLite had rolled back before the commit record could reach the file (a full
  // disk, a failed write) is not in doubt either; any other failure is in doubt (see
  // make_sqlite_error).
  void commit();
  // ROLLBACK now (errors ignored: SQLite may have rolled back already).
  void rollback() noexcept;

 private:
  Connection& connection_;
  bool open_ = true;
};

}  // namespace idem::sqlite::detail
