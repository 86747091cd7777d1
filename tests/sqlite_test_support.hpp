// What the SQLite backend's unit tests (sqlite_recorder_test.cpp, sqlite_store_test.cpp) share:
// options on the test's clock, the bytes of a database file, the error a call must throw, and
// the files a backend must refuse to open, left as they were.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/sqlite/sqlite_options.hpp"
#include "sqlite_raw_db.hpp"
#include "temp_dir.hpp"

namespace idem::test {

inline idem::sqlite::SqliteOptions with_clock(std::shared_ptr<idem::Clock> clock) {
  idem::sqlite::SqliteOptions options;
  options.clock = std::move(clock);
  return options;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every byte of a file ("" when it does not exist).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `fn` and returns the E it threw; a test failure (and nullopt) when it threw something else
// or nothing.
template <class E, class Fn>
std::optional<E> error_thrown_by(Fn&& fn, const char* expected) {
  try {
    std::forward<Fn>(fn)();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << expected << ", got: " << e.what();
    return std::nullopt;
  }
  ADD_FAILURE() << "expected " << expected << ", nothing was thrown";
  return std::nullopt;
}

// Runs `open`, which must throw E with `code` and a message naming each of `mentions`.
template <class E, class Open>
void expect_refused(Open&& open, idem::ErrorCode code,
                    std::initializer_list<const char*> mentions) {
  const auto error = error_thrown_by<E>(std::forward<Open>(open), "the open to be refused");
  if (!error) return;
  EXPECT_EQ(error->code(), code) << error->what();
  for (const char* mention : mentions) {
    EXPECT_TRUE(contains(error->what(), mention)) << error->what();
  }
}

// A file a backend must refuse to open: its name, the plain SQL that makes it (in rollback mode,
// as other programs leave a file) and the error the backend must give.
struct RefusedFile {
  const char* name;
  const char* sql;
  idem::ErrorCode code;
};

// Makes `file` in `dir` and opens it with `open(path)`, which must throw E with the file's code,
// not retryable. The backend checks a file before it switches the journal mode or adds a table,
// so the refused file is left as it was: byte for byte, with no WAL or journal beside it, still
// in rollback mode. Returns the file's path.
template <class E, class Open>
std::string expect_refused_unchanged(TempDir& dir, const RefusedFile& file, Open&& open) {
  const std::string path = dir.file(file.name);
  RawDb(path).exec(file.sql);
  const std::string before = file_bytes(path);
  if (before.empty()) {
    ADD_FAILURE() << "the SQL made no file";
    return path;
  }
  const auto error = error_thrown_by<E>([&] { open(path); }, "the open to be refused");
  if (!error) return path;
  EXPECT_EQ(error->code(), file.code) << error->what();
  EXPECT_FALSE(error->retryable());
  EXPECT_EQ(file_bytes(path), before) << "a refused file must not change";
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path + "-journal"));
  EXPECT_EQ(RawDb(path).text("PRAGMA journal_mode"), "delete");
  return path;
}

}  // namespace idem::test
