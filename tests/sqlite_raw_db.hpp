// A plain sqlite3 connection of the test's own, as another program on the same file has (the
// sqlite3 shell, infinity_bus, an operator, a buggy writer): it reads and writes idem's tables
// with plain SQL, holds locks, and looks at what worker processes left behind. A 5 s busy
// timeout, as such a program would set; closed by RAII.
//
// Thread-safety: one RawDb per thread (one sqlite3 connection).
#pragma once

#include <sqlite3.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace idem::test {

class RawDb {
 public:
  static constexpr int kReadWrite = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  static constexpr int kReadOnly = SQLITE_OPEN_READONLY;

  explicit RawDb(const std::string& path, int flags = kReadWrite) {
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      const std::string message = sqlite3_errmsg(db_);
      sqlite3_close_v2(db_);
      throw std::runtime_error("raw open of " + path + " failed: " + message);
    }
    sqlite3_busy_timeout(db_, 5000);
  }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;
  ~RawDb() { sqlite3_close_v2(db_); }

  // Runs `sql` (any number of statements); throws with SQLite's message.
  void exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error != nullptr ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error("raw exec failed: " + message + " in: " + sql);
    }
  }
  // The first column of the first row, as text (nullopt: no row or NULL).
  std::optional<std::string> text(const std::string& sql) {
    return first(sql, [](sqlite3_stmt* stmt) {
      return std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
    });
  }
  // The first column of the first row as bytes, NULs included (nullopt: no row or NULL).
  std::optional<std::string> bytes(const std::string& sql) {
    return first(sql, [](sqlite3_stmt* stmt) {
      const auto* data = static_cast<const char*>(sqlite3_column_blob(stmt, 0));
      return std::string(data == nullptr ? "" : data,
                         static_cast<std::size_t>(sqlite3_column_bytes(stmt, 0)));
    });
  }
  // The first column of the first row as an integer (-1: no row or NULL).
  long long integer(const std::string& sql) {
    return first(sql, [](sqlite3_stmt* stmt) { return sqlite3_column_int64(stmt, 0); })
        .value_or(-1);
  }
  // The first column of every row, as text (NULL as "").
  std::vector<std::string> column(const std::string& sql) {
    sqlite3_stmt* stmt = prepare(sql);
    std::vector<std::string> values;
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      const auto* text = sqlite3_column_text(stmt, 0);
      values.emplace_back(text == nullptr ? "" : reinterpret_cast<const char*>(text));
    }
    sqlite3_finalize(stmt);
    return values;
  }
  sqlite3* db() const { return db_; }

 private:
  sqlite3_stmt* prepare(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      throw std::runtime_error("raw prepare failed: " + std::string(sqlite3_errmsg(db_)) +
                               " in: " + sql);
    }
    return stmt;
  }

  template <class Read>
  auto first(const std::string& sql, Read read) -> std::optional<decltype(read(nullptr))> {
    sqlite3_stmt* stmt = prepare(sql);
    std::optional<decltype(read(nullptr))> result;
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_type(stmt, 0) != SQLITE_NULL) {
      result = read(stmt);
    }
    sqlite3_finalize(stmt);
    return result;
  }

  sqlite3* db_ = nullptr;
};

// One query on a connection of its own, read-only: the first column of the first row as an
// integer (-1: no row or NULL).
inline long long sqlite_query_int(const std::string& path, const std::string& sql) {
  return RawDb(path, RawDb::kReadOnly).integer(sql);
}

// Runs `sql` on a connection of its own; throws with SQLite's message.
inline void sqlite_exec(const std::string& path, const std::string& sql) {
  RawDb(path).exec(sql);
}

}  // namespace idem::test
