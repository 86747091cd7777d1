// The outbox conformance suite (idem/testing/outbox_conformance.hpp) against SqliteOutbox, on a
// file in a fresh temporary directory shared with a SqliteIdempotencyRecorder.
#include <memory>
#include <string>

#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/outbox_conformance.hpp"

namespace {

struct SqliteOutboxFactory {
  idem::testing::OutboxUnderTest make() {
    return {std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path()),
            std::make_shared<idem::sqlite::SqliteOutbox>(path())};
  }
  // Its own connection and lock descriptor, as another process would have.
  std::shared_ptr<idem::Outbox> another() {
    return std::make_shared<idem::sqlite::SqliteOutbox>(path());
  }
  std::string path() const { return (dir.path() / "outbox.db").string(); }

  idem::test::TempDir dir;
};

}  // namespace

INSTANTIATE_OUTBOX_CONFORMANCE(Sqlite, SqliteOutboxFactory);
