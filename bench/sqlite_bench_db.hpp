// The database files of the SQLite benchmarks (sqlite_recorder_bench.cpp, sqlite_store_bench.cpp)
// and the raw sqlite3 connection of their baselines: a new file per benchmark under the
// temporary directory, removed with its -wal and -shm afterwards.
#pragma once

#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace idem::bench {

// A path no other benchmark of this process uses: <tmp>/<program>-<pid>/bench-<n>.db.
inline std::string fresh_db_path(const std::string& program) {
  static std::atomic<int> counter{0};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (program + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / ("bench-" + std::to_string(counter++) + ".db")).string();
}

inline void remove_db(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"})
    std::filesystem::remove(path + suffix);
}

// Runs `body(path)` (the benchmark's loop over `state`), counts its iterations as the items
// processed, and removes the file.
template <class Body>
void on_db_file(benchmark::State& state, const std::string& path, Body&& body) {
  body(path);
  state.SetItemsProcessed(state.iterations());
  remove_db(path);
}

// A raw connection to `path` set up as the backend sets up its own (a 5 s busy timeout, WAL,
// synchronous FULL or NORMAL), and the statements prepared on it, finalized and closed together.
// Every step that fails throws std::runtime_error.
class RawDb {
 public:
  RawDb(const std::string& path, bool full) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
      sqlite3_close(db_);
      throw std::runtime_error("open");
    }
    sqlite3_busy_timeout(db_, 5000);
    try {
      exec("PRAGMA journal_mode=WAL");
      exec(full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
    } catch (...) {
      sqlite3_close(db_);
      throw;
    }
  }
  ~RawDb() {
    for (sqlite3_stmt* statement : statements_)
      sqlite3_finalize(statement);
    sqlite3_close(db_);
  }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  sqlite3* get() const noexcept { return db_; }

  void exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      throw std::runtime_error(sqlite3_errmsg(db_));
    }
  }

  // A statement that lives as long as the connection.
  sqlite3_stmt* prepare(const char* sql) {
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr) != SQLITE_OK) {
      throw std::runtime_error(sqlite3_errmsg(db_));
    }
    statements_.push_back(statement);
    return statement;
  }

 private:
  sqlite3* db_ = nullptr;
  std::vector<sqlite3_stmt*> statements_;
};

}  // namespace idem::bench
