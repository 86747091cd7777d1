#include "connection.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <optional>
#include <system_error>
#include <thread>
#include <type_traits>
#include <variant>

#include "idem/error.hpp"

namespace idem::sqlite::detail {

namespace {

// Statements beyond this many are prepared per use instead of cached, so SQL built with
// inlined values (instead of parameters) cannot grow the cache without bound.
constexpr std::size_t kMaxCachedStatements = 256;

std::string excerpt(std::string_view sql) {
  constexpr std::size_t kMax = 80;
  std::string out(sql.substr(0, kMax));
  for (char& c : out) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  if (sql.size() > kMax) out += "...";
  return out;
}

bool only_blank(const char* tail) {
  for (; tail != nullptr && *tail != '\0'; ++tail) {
    if (*tail != ' ' && *tail != '\n' && *tail != '\r' && *tail != '\t' && *tail != ';') {
      return false;
    }
  }
  return true;
}

}  // namespace

bool wait_for_lock(std::chrono::steady_clock::time_point deadline, int attempts) noexcept {
  using std::chrono::microseconds;
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return false;
  // The holder is usually one short transaction from done: yield first, then back off
  // exponentially from 10 us to 2 ms, never past the deadline.
  if (attempts < 2) {
    std::this_thread::yield();
    return true;
  }
  const int shift = std::min(attempts - 2, 8);
  auto delay = std::min(microseconds(10 << shift), microseconds(2000));
  delay =
      std::min(delay, std::chrono::duration_cast<microseconds>(deadline - now) + microseconds(1));
  std::this_thread::sleep_for(delay);
  return true;
}

void retry_while_busy(std::chrono::milliseconds timeout, const std::function<void()>& step) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int attempts = 0;; ++attempts) {
    try {
      step();
      return;
    } catch (const SqliteError& e) {
      if (e.code() != ErrorCode::store_busy || !wait_for_lock(deadline, attempts)) throw;
    }
  }
}

// ---- Statement ------------------------------------------------------------------------------

Statement::~Statement() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

Statement& Statement::bind(int index, std::int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK) connection_->fail(rc, "binding parameter " + std::to_string(index));
  return *this;
}

Statement& Statement::bind(int index, std::string_view text) {
  // An empty view may have a null data(); SQLite would bind that as NULL, not ''.
  const char* data = text.data() != nullptr ? text.data() : "";
  const int rc = sqlite3_bind_text64(stmt_, index, data, text.size(), SQLITE_STATIC, SQLITE_UTF8);
  if (rc != SQLITE_OK) connection_->fail(rc, "binding parameter " + std::to_string(index));
  return *this;
}

Statement& Statement::bind_null(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) connection_->fail(rc, "binding parameter " + std::to_string(index));
  return *this;
}

Statement& Statement::bind(int index, const SqlParam& param) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::nullptr_t>) {
          bind_null(index);
        } else if constexpr (std::is_same_v<T, bool>) {
          bind(index, std::int64_t{v ? 1 : 0});  // SQLite has no boolean: 0 or 1
        } else if constexpr (std::is_same_v<T, std::int64_t>) {
          bind(index, v);
        } else if constexpr (std::is_same_v<T, double>) {
          const int rc = sqlite3_bind_double(stmt_, index, v);
          if (rc != SQLITE_OK) connection_->fail(rc, "binding parameter " + std::to_string(index));
        } else if constexpr (std::is_same_v<T, std::string_view>) {
          bind(index, v);
        } else {
          static const char kEmpty = '\0';
          const void* data = v.bytes.data() != nullptr ? v.bytes.data() : &kEmpty;
          const int rc = sqlite3_bind_blob64(stmt_, index, data, v.bytes.size(), SQLITE_STATIC);
          if (rc != SQLITE_OK) connection_->fail(rc, "binding parameter " + std::to_string(index));
        }
      },
      param.value());
  return *this;
}

int Statement::parameter_count() const noexcept {
  return sqlite3_bind_parameter_count(stmt_);
}

int Statement::step_code() noexcept {
  return sqlite3_step(stmt_);
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  connection_->fail(rc, "running \"" + excerpt(sqlite3_sql(stmt_)) + "\"");
}

std::int64_t Statement::run() {
  while (step()) {
  }
  return sqlite3_changes64(connection_->db());
}

bool Statement::column_is_null(int column) const noexcept {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int Statement::column_type(int column) const noexcept {
  return sqlite3_column_type(stmt_, column);
}

std::string Statement::column_blob(int column) const {
  const auto* bytes = static_cast<const char*>(sqlite3_column_blob(stmt_, column));
  if (bytes == nullptr) return {};
  return std::string(bytes, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)));
}

std::int64_t Statement::column_int64(int column) const noexcept {
  return sqlite3_column_int64(stmt_, column);
}

std::string Statement::column_text(int column) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
  if (text == nullptr) return {};
  return std::string(text, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)));
}

// ---- Connection -----------------------------------------------------------------------------

Connection::Connection(const std::string& path, const SqliteOptions& options, bool create,
                       bool read_only)
    : path_(path),
      clock_(options.clock ? options.clock : system_clock()),
      busy_timeout_(options.busy_timeout) {
  // NOMUTEX: the recorder never lets two threads use one connection at once, so SQLite's own
  // per-connection mutex would only cost time. EXRESCODE: extended codes from every call.
  int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  flags |= read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
  if (create && !read_only) flags |= SQLITE_OPEN_CREATE;
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  db_.reset(raw);  // closed by RAII even when the open failed
  if (rc != SQLITE_OK) {
    throw_sqlite_error(raw, rc, "opening the database", path_);
  }
  // Our own busy handler instead of sqlite3_busy_timeout(): SQLite's sleeps 1 ms at least per
  // retry, which starves several processes taking turns at short write transactions.
  sqlite3_busy_handler(db_.get(), &Connection::on_busy, this);
}

Connection::~Connection() {
  // Statements must be finalized before the connection closes; the map goes first.
  cache_.clear();
}

int Connection::on_busy(void* self, int attempts) noexcept {
  auto* connection = static_cast<Connection*>(self);
  if (attempts == 0) {
    connection->busy_deadline_ = std::chrono::steady_clock::now() + connection->busy_timeout_;
  }
  return wait_for_lock(connection->busy_deadline_, attempts) ? 1 : 0;
}

Statement Connection::prepare(std::string_view sql) {
  if (auto it = cache_.find(sql); it != cache_.end()) return Statement(*this, it->second.get());
  if (sql.size() > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument("SQL text of " + std::to_string(sql.size()) + " bytes is too long");
  }
  sqlite3_stmt* raw = nullptr;
  const char* tail = nullptr;
  const int rc = sqlite3_prepare_v3(db_.get(), sql.data(), static_cast<int>(sql.size()),
                                    SQLITE_PREPARE_PERSISTENT, &raw, &tail);
  StatementHandle handle(raw);
  if (rc != SQLITE_OK) fail(rc, "preparing \"" + excerpt(sql) + "\"");
  if (!handle) throw InvalidArgument("the SQL text \"" + excerpt(sql) + "\" holds no statement");
  if (tail != nullptr && tail < sql.data() + sql.size() &&
      !only_blank(std::string(tail, sql.data() + sql.size()).c_str())) {
    throw InvalidArgument("one SQL statement at a time, but \"" + excerpt(sql) +
                          "\" continues after the first: \"" +
                          excerpt(std::string_view(tail, sql.data() + sql.size() - tail)) + "\"");
  }
  if (cache_.size() >= kMaxCachedStatements) {
    // Too many distinct statements: this one lives only as long as the Statement.
    sqlite3_stmt* stmt = handle.get();
    return Statement(*this, stmt, std::move(handle));
  }
  auto [it, inserted] = cache_.emplace(std::string(sql), std::move(handle));
  return Statement(*this, it->second.get());
}

void Connection::exec_script(const char* sql,
                             const std::function<void(std::string_view first_column)>& row) {
  struct Context {
    const std::function<void(std::string_view)>* row;
  } context{&row};
  char* error = nullptr;
  const int rc = sqlite3_exec(
      db_.get(), sql,
      [](void* ctx, int columns, char** values, char**) -> int {
        const auto* c = static_cast<Context*>(ctx);
        if (*c->row && columns > 0) (*c->row)(values[0] != nullptr ? values[0] : "");
        return 0;
      },
      &context, &error);
  sqlite3_free(error);  // sqlite3_errmsg() still holds the message
  if (rc != SQLITE_OK) fail(rc, "running \"" + excerpt(sql) + "\"");
}

void Connection::fail(int rc, std::string_view action, Phase phase) const {
  throw_sqlite_error(db_.get(), rc, action, path_, phase);
}

void Connection::check_file_not_replaced(std::string_view action) {
  if (path_ == ":memory:") return;
  if (replaced_.empty()) {
    const SteadyTime now = clock_->steady_now();
    if (last_replacement_check_ && now - *last_replacement_check_ < kReplacementCheckInterval) {
      return;
    }
    last_replacement_check_ = now;
    int moved = 0;
    // The unix VFS answers with one stat() of the path; a VFS that does not know the opcode
    // (SQLITE_NOTFOUND) cannot tell, and the write goes ahead as before.
    if (sqlite3_file_control(db_.get(), "main", SQLITE_FCNTL_HAS_MOVED, &moved) != SQLITE_OK ||
        moved == 0) {
      return;
    }
    struct stat st {};
    replaced_ = ::stat(path_.c_str(), &st) != 0 ? "the file was deleted (or renamed away)"
                                                : "another file was renamed over it";
  }
  throw SqliteError(ErrorCode::store_replaced,
                    std::string(action) + " on '" + path_ + "' refused: " + replaced_ +
                        " while it was open, so writes would go to a file no other process "
                        "sees (nothing of this call was written; open the recorder or store "
                        "again)",
                    SQLITE_READONLY, SQLITE_READONLY_DBMOVED, /*retryable=*/false,
                    /*in_doubt=*/false);
}

// ---- opening ---------------------------------------------------------------------------------

void check_open_arguments(const std::string& path, const SqliteOptions& options) {
  if (path.empty()) {
    throw InvalidArgument("SQLite database path is empty: give a file path or \":memory:\"");
  }
  if (path.find('\0') != std::string::npos) {
    throw InvalidArgument("SQLite database path contains a NUL byte");
  }
  if (options.busy_timeout < std::chrono::milliseconds::zero()) {
    throw ConfigError("SqliteOptions::busy_timeout must be >= 0, got " +
                      std::to_string(options.busy_timeout.count()) + " ms");
  }
  if (options.max_batch_size == 0) {
    throw ConfigError("SqliteOptions::max_batch_size must be >= 1 (1 turns group commit off)");
  }
  if (sqlite3_threadsafe() == 0) {
    throw ConfigError("libsqlite3 was built without thread support (SQLITE_THREADSAFE=0)");
  }
}

namespace {

// PRAGMA synchronous decides both when commits fsync and whether checkpoints do.
void set_synchronous(Connection& connection, Durability durability) {
  switch (durability) {
    case Durability::full:
      connection.exec_script("PRAGMA synchronous=FULL");
      break;
    case Durability::normal:
      connection.exec_script("PRAGMA synchronous=NORMAL");
      break;
    case Durability::off:
      connection.exec_script("PRAGMA synchronous=OFF");
      break;
  }
}

}  // namespace

std::unique_ptr<Connection> open_writer(const std::string& path, const SqliteOptions& options) {
  std::unique_ptr<Connection> writer;
  const bool create = !options.read_only && options.create_schema;
  // SQLite opens a directory and fails at the first read, with "disk I/O error".
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) {
    throw SqliteError(ErrorCode::store_open_failed,
                      "opening the database on '" + path +
                          "': it is a directory, not a database file (name a file in it, e.g. '" +
                          (std::filesystem::path(path) / "idem.db").string() + "')",
                      SQLITE_CANTOPEN, SQLITE_CANTOPEN, /*retryable=*/false, /*in_doubt=*/false);
  }
  try {
    writer = std::make_unique<Connection>(path, options, create, options.read_only);
  } catch (const SqliteError& e) {
    if (e.code() != ErrorCode::store_open_failed) throw;
    // SQLite says only "unable to open database file"; say which part of the path is wrong.
    std::error_code ec;
    const std::filesystem::path file(path);
    const auto parent = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
    std::string hint;
    if (!std::filesystem::exists(parent, ec)) {
      hint = "; the directory '" + parent.string() + "' does not exist";
    } else if (std::filesystem::is_directory(file, ec)) {
      hint = "; it is a directory";
    } else if (!std::filesystem::exists(file, ec) && options.read_only) {
      hint = "; the file does not exist (read_only never creates it)";
    } else if (!std::filesystem::exists(file, ec) && !create) {
      hint = "; the file does not exist (create_schema = false never creates it)";
    }
    throw SqliteError(e.code(), e.message() + hint, e.sqlite_code(), e.extended_code(),
                      e.retryable(), e.in_doubt());
  }
  // A property of the connection, not the file.
  retry_while_busy(options.busy_timeout, [&] { set_synchronous(*writer, options.durability); });
  return writer;
}

void use_wal(Connection& writer) {
  std::string mode;
  writer.exec_script("PRAGMA journal_mode=WAL", [&](std::string_view m) { mode = m; });
  if (mode != "wal") {
    throw SqliteError(ErrorCode::store_open_failed,
                      "PRAGMA journal_mode=WAL on '" + writer.path() +
                          "' was refused (the mode is '" + mode +
                          "'); several processes can only share the file in WAL mode",
                      SQLITE_ERROR, SQLITE_ERROR, false, false);
  }
}

std::string journal_mode(Connection& connection) {
  std::string mode;
  connection.exec_script("PRAGMA journal_mode", [&](std::string_view m) { mode = m; });
  return mode;
}

bool has_table(Connection& connection, std::string_view name) {
  Statement select =
      connection.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
  select.bind(1, name);
  return select.step();
}

std::unique_ptr<Checkpointer> start_checkpointer(Connection& writer, const std::string& path,
                                                 const SqliteOptions& options) {
  if (path == ":memory:" || options.read_only) return nullptr;
  return std::make_unique<Checkpointer>(writer, path, options);
}

// ---- ConnectionSet --------------------------------------------------------------------------

void ConnectionSet::open(const std::function<bool()>& check_schema,
                         const std::function<void()>& create_schema) {
  writer_ = open_writer(path_, options_);  // synchronous, clear open errors; writes nothing
  bool checkpoints = false;
  // Each step may meet another connection's lock, and the journal-mode switch meets it without
  // SQLite calling the busy handler: every step is run again until the busy timeout is spent
  // (DESIGN-NOTES §73). A step that failed changed nothing (check_schema only reads, the switch
  // either happens or not, create_schema is one transaction), so running them all again is safe.
  retry_while_busy(options_.busy_timeout, [&] {
    // The check only reads (a file that is not a database fails its first statement with
    // SQLITE_NOTADB): a file it refuses is left byte for byte as it was.
    const bool missing = check_schema();
    if (options_.read_only || !options_.create_schema) {
      // The file as it is: its journal mode (an infinity_bus file stays in rollback mode), no
      // tables added. Without WAL there is nothing for the checkpoint thread to do.
      checkpoints = !in_memory_ && !options_.read_only && journal_mode(*writer_) == "wal";
      return;
    }
    if (!in_memory_) use_wal(*writer_);
    if (missing) create_schema();
    checkpoints = true;
  });
  if (checkpoints) {
    retry_while_busy(options_.busy_timeout,
                     [&] { checkpointer_ = start_checkpointer(*writer_, path_, options_); });
  }
}

std::unique_ptr<Connection> ConnectionSet::take_reader() {
  {
    std::lock_guard lock(readers_mutex_);
    if (!idle_readers_.empty()) {
      auto reader = std::move(idle_readers_.back());
      idle_readers_.pop_back();
      return reader;
    }
  }
  // Opened outside the lock: opening touches the file and may wait on the busy handler.
  return std::make_unique<Connection>(path_, options_, /*create=*/false, options_.read_only);
}

void ConnectionSet::return_reader(std::unique_ptr<Connection> reader) noexcept {
  std::lock_guard lock(readers_mutex_);
  if (idle_readers_.size() >= options_.max_idle_readers) return;  // closed here
  try {
    idle_readers_.push_back(std::move(reader));
  } catch (...) {
    // No room to keep it: it closes, and the next read opens another.
  }
}

ConnectionSet::ReadLease::ReadLease(ConnectionSet& set, Prefer prefer, bool holds_writer)
    : set_(set) {
  set.check_process();
  if (holds_writer) {
    connection_ = set.writer_.get();
  } else if (set.in_memory_) {
    writer_lock_ = std::unique_lock(set.writer_mutex_);
    connection_ = set.writer_.get();
  } else if (prefer == Prefer::idle_writer &&
             (writer_lock_ = std::unique_lock(set.writer_mutex_, std::try_to_lock))) {
    connection_ = set.writer_.get();
  } else {
    reader_ = set.take_reader();
    connection_ = reader_.get();
  }
}

ConnectionSet::ReadLease::~ReadLease() {
  if (reader_) set_.return_reader(std::move(reader_));
}

// ---- Checkpointer ---------------------------------------------------------------------------

Checkpointer::Checkpointer(Connection& writer, const std::string& path,
                           const SqliteOptions& options)
    : writer_(writer), connection_(path, options, /*create=*/false, /*read_only=*/false) {
  // The checkpoint syncs as the writer's commits do (none at all at Durability::off).
  set_synchronous(connection_, options.durability);
  thread_ = std::thread([this] { run(); });
  // Replaces SQLite's automatic checkpoint, which is itself a WAL hook.
  sqlite3_wal_hook(writer_.db(), &Checkpointer::on_commit, this);
}

Checkpointer::~Checkpointer() {
  sqlite3_wal_autocheckpoint(writer_.db(), kWakePages);  // removes our hook
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

std::uint64_t Checkpointer::checkpoints() const {
  std::lock_guard lock(mutex_);
  return checkpoints_;
}

std::uint64_t Checkpointer::wait_for_checkpoints(std::uint64_t count,
                                                 std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  checkpointed_.wait_for(lock, timeout, [&] { return checkpoints_ >= count; });
  return checkpoints_;
}

int Checkpointer::on_commit(void* self, sqlite3* db, const char* schema, int wal_pages) noexcept {
  auto* checkpointer = static_cast<Checkpointer*>(self);
  // Frames the thread has not copied yet. A WAL smaller than at the last commit was restarted:
  // nothing in it is copied. (A count larger than the WAL is one the thread stored for the
  // WAL before the restart.)
  if (wal_pages < checkpointer->last_wal_pages_) checkpointer->copied_pages_.store(0);
  checkpointer->last_wal_pages_ = wal_pages;
  const int copied = checkpointer->copied_pages_.load();
  const int uncopied = copied <= wal_pages ? wal_pages - copied : wal_pages;
  const auto checkpoint_here = [&] {
    // Ignoring the result as SQLite's automatic checkpoint does (the commit has succeeded).
    int copied_now = 0;
    if (sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, &copied_now) ==
        SQLITE_OK)
      checkpointer->copied_pages_.store(copied_now);
  };
  const std::uint64_t finished = checkpointer->finished_.load();
  if (wal_pages >= kInlinePages) {
    checkpoint_here();  // the thread is behind: as SQLite's automatic checkpoint would
  } else if (wal_pages >= kWakePages && uncopied <= kTailPages &&
             finished != checkpointer->tail_after_) {
    // The thread has copied all but the frames committed while it ran: copy those here, so the
    // next commit restarts the WAL. Once per background checkpoint, so a reader that keeps the
    // copy from completing costs at most one small checkpoint per cycle.
    checkpointer->tail_after_ = finished;
    checkpoint_here();
  } else if (uncopied >= kWakePages) {
    {
      std::lock_guard lock(checkpointer->mutex_);
      checkpointer->requested_ = true;
    }
    checkpointer->wake_.notify_one();
  }
  return SQLITE_OK;
}

void Checkpointer::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return requested_ || stopping_; });
    if (stopping_) return;
    requested_ = false;
    lock.unlock();
    // SQLITE_BUSY (another connection is checkpointing) and I/O errors leave the WAL as it was;
    // the next request tries again.
    int copied = 0;  // frames of the WAL copied so far, by this checkpoint or earlier ones
    if (sqlite3_wal_checkpoint_v2(connection_.db(), "main", SQLITE_CHECKPOINT_PASSIVE, nullptr,
                                  &copied) == SQLITE_OK)
      copied_pages_.store(copied);
    finished_.fetch_add(1);
    lock.lock();
    ++checkpoints_;
    checkpointed_.notify_all();
  }
}

// ---- WriteTransaction -----------------------------------------------------------------------

WriteTransaction::WriteTransaction(Connection& connection) : connection_(connection) {
  // IMMEDIATE takes the write lock now, waiting in the busy handler. A deferred transaction
  // that reads first and writes later could instead fail with SQLITE_BUSY_SNAPSHOT, which no
  // busy timeout helps.
  connection_.prepare("BEGIN IMMEDIATE").run();
  // Checked once the lock is held, so a replacement made while this call waited is seen too;
  // reads in this transaction would otherwise answer from the old file.
  try {
    connection_.check_file_not_replaced("BEGIN IMMEDIATE");
  } catch (...) {
    rollback();
    throw;
  }
}

WriteTransaction::~WriteTransaction() {
  rollback();
}

void WriteTransaction::commit() {
  std::optional<SqliteError> error;
  try {
    // Again just before COMMIT: a transactional handler may have run for a long time since
    // BEGIN. Refused here, the transaction rolls back: known not committed.
    connection_.check_file_not_replaced("COMMIT");
  } catch (...) {
    rollback();
    throw;
  }
  {
    Statement commit = connection_.prepare("COMMIT");
    const int rc = commit.step_code();
    if (rc == SQLITE_DONE) {
      open_ = false;
      return;
    }
    // Built while SQLite still holds the failure's message; Phase::commit decides in_doubt.
    error.emplace(
        make_sqlite_error(connection_.db(), rc, "COMMIT", connection_.path(), Phase::commit));
  }
  rollback();
  throw *std::move(error);
}

void WriteTransaction::rollback() noexcept {
  if (!open_) return;
  open_ = false;
  // After some errors SQLite has already rolled back; a second ROLLBACK would only fail.
  if (sqlite3_get_autocommit(connection_.db()) != 0) return;
  try {
    connection_.prepare("ROLLBACK").run();
  } catch (...) {
    // Nothing more to do: the connection is closed or broken, and closing it rolls back.
  }
}

void GroupCommitQueue::run(Entry& entry,
                           const std::function<void(std::size_t& taken)>& commit_front) {
  std::unique_lock lock(mutex_);
  entry.cv = &cvs_[next_cv_++ % cvs_.size()];
  queue_.push_back(&entry);
  entry.cv->wait(lock, [&] { return entry.done || queue_.front() == &entry; });
  if (!entry.done) {
    // At the front: commit this entry and those queued behind it; the others wait for that.
    lock.unlock();
    std::size_t taken = 0;
    std::exception_ptr error;
    try {
      commit_front(taken);
    } catch (...) {
      error = std::current_exception();
    }
    std::array<bool, std::tuple_size_v<decltype(cvs_)>> wake{};
    lock.lock();
    if (taken == 0 && queue_.front() == &entry) taken = 1;  // failed before it collected
    for (std::size_t i = 0; i < taken; ++i) {
      Entry* done = queue_.front();
      queue_.pop_front();
      done->done = true;
      if (error && !done->error) done->error = error;
      wake[static_cast<std::size_t>(done->cv - cvs_.data())] = true;
    }
    // The next front becomes the committer.
    if (!queue_.empty()) wake[static_cast<std::size_t>(queue_.front()->cv - cvs_.data())] = true;
    lock.unlock();
    for (std::size_t i = 0; i < wake.size(); ++i) {
      if (wake[i]) cvs_[i].notify_all();  // shared slots: wake all, each re-checks
    }
  }
  if (entry.error) std::rethrow_exception(entry.error);
}

}  // namespace idem::sqlite::detail
