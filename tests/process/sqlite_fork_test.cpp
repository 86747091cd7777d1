// fork() in a process that has used the SQLite recorder and store (the cases: fork_case.hpp).
//
//   * the parent's objects, and with them their connections and checkpoint threads, are gone
//     before the fork: the child opens the same files anew and uses both faces;
//   * objects alive at the fork are refused in the child (ConfigError from the recorder's and the
//     store's calls), and the parent goes on using them.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "../temp_dir.hpp"
#include "fork_case.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

class ForkSqlite : public ::testing::Test {
 protected:
  idem::test::TempDir dir_;
  const std::string recorder_path_ = dir_.file("recorder.db");
  const std::string store_path_ = dir_.file("store.db");
  const idem::test::fork::Backend backend_{
      [this] { return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(recorder_path_); },
      [this] { return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(store_path_); }};
};

TEST_F(ForkSqlite, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  EXPECT_EQ(idem::test::fork::fork_after_use(backend_), "");
}

TEST_F(ForkSqlite, ObjectsAliveAtForkAreRefusedInTheChild) {
  EXPECT_EQ(idem::test::fork::alive_at_fork(backend_), "");
}

}  // namespace
