// The outbox on SQLite (tests/outbox_case.hpp), and follow_up_id itself.
#include <gtest/gtest.h>

#include "../outbox_case.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace {

using idem::test::OutboxFixture;

struct SqliteOutboxTest : ::testing::Test {
  idem::test::TempDir dir;
  std::string path = dir.file("inbox.db");
  OutboxFixture f{std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path),
                  std::make_shared<idem::sqlite::SqliteOutbox>(path)};
};

TEST(FollowUpId, IsDeterministicLowercaseHexVersion5) {
  const std::string id = idem::follow_up_id("billing", "e1", 0);
  EXPECT_EQ(id, idem::follow_up_id("billing", "e1", 0));
  ASSERT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(id[12], '5');
  EXPECT_NE(std::string("89ab").find(id[16]), std::string::npos);
  EXPECT_NE(id, idem::follow_up_id("billing", "e1", 1));
  EXPECT_NE(id, idem::follow_up_id("billing", "e2", 0));
  EXPECT_NE(id, idem::follow_up_id("shipping", "e1", 0));
  // Each part is length-prefixed: moving a separator changes the id.
  EXPECT_NE(idem::follow_up_id("a:b", "c", 0), idem::follow_up_id("a", "b:c", 0));
}

TEST_F(SqliteOutboxTest, FollowUpsCommitAndRollBackWithTheMarker) {
  idem::test::outbox_commit_and_rollback_case(f);
}

TEST_F(SqliteOutboxTest, BinaryPayloadsSurvive) {
  idem::test::outbox_binary_payload_case(f);
}

TEST_F(SqliteOutboxTest, ABadFollowUpFailsTheHandler) {
  idem::test::outbox_bad_follow_up_case(f);
}

TEST_F(SqliteOutboxTest, RelayRepublishesAfterLostConfirmsAndDownstreamDedups) {
  idem::test::outbox_relay_through_bus_case(f);
}

TEST_F(SqliteOutboxTest, RefusedRowsAreParkedWithTheirReason) {
  idem::test::outbox_parking_case(f);
}

TEST_F(SqliteOutboxTest, RelayWakesOnCommit) {
  idem::test::outbox_relay_wakes_on_commit_case(f);
}

TEST_F(SqliteOutboxTest, ConcurrentRelaysPublishEachRowOnceInOrder) {
  // Three outbox objects on one file (as three processes would have) and two threads on one.
  auto second = std::make_shared<idem::sqlite::SqliteOutbox>(path);
  auto third = std::make_shared<idem::sqlite::SqliteOutbox>(path);
  idem::test::outbox_concurrent_relays_case(f, {f.outbox, f.outbox, second, third});
}

TEST_F(SqliteOutboxTest, OutboxNeedsTransactionalMode) {
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::exclusive;
  options.outbox = f.outbox;
  EXPECT_THROW(idem::make_idempotent_handler(
                   "c", f.recorder, [](const std::string&) {}, options),
               idem::ConfigError);
}

TEST(SqliteOutbox, RefusesAPrivateInMemoryDatabase) {
  EXPECT_THROW(idem::sqlite::SqliteOutbox(":memory:"), idem::InvalidArgument);
}

TEST(SqliteOutboxRelay, RejectsBadOptions) {
  idem::test::TempDir dir;
  auto outbox = std::make_shared<idem::sqlite::SqliteOutbox>(dir.file("o.db"));
  auto publisher = std::make_shared<idem::test::RecordingPublisher>();
  idem::OutboxRelayOptions bad;
  bad.batch_size = 0;
  EXPECT_THROW(idem::OutboxRelay(outbox, publisher, bad), idem::ConfigError);
  bad = {};
  bad.max_attempts = 0;
  EXPECT_THROW(idem::OutboxRelay(outbox, publisher, bad), idem::ConfigError);
  EXPECT_THROW(idem::OutboxRelay(nullptr, publisher), idem::InvalidArgument);
}

}  // namespace
