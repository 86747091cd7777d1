// What the SQLite backend's unit tests (sqlite_recorder_test.cpp, sqlite_store_test.cpp) share:
// options on the test's clock, the bytes of a database file, and the error a call must throw.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "idem/clock.hpp"
#include "idem/sqlite/sqlite_options.hpp"

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

}  // namespace idem::test
