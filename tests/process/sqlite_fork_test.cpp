// fork() in a process that has used the SQLite recorder and store (the case itself:
// fork_case.hpp). The parent's objects, and with them their connections and checkpoint threads,
// are gone before the fork; the child opens the same files anew.
#include <gtest/gtest.h>

#include <memory>

#include "../temp_dir.hpp"
#include "fork_case.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

TEST(ForkSqlite, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  idem::test::TempDir dir;
  const std::string recorder_path = dir.file("recorder.db");
  const std::string store_path = dir.file("store.db");
  const idem::test::fork::Backend backend{
      [&] { return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(recorder_path); },
      [&] { return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(store_path); }};
  EXPECT_EQ(idem::test::fork::fork_after_use(backend), "");
}

}  // namespace
