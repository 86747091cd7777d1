// The outbox on PostgreSQL (tests/outbox_case.hpp) on a real server (IDEM_TEST_POSTGRES_URL):
// the same cases as SQLite's, several relays with SKIP LOCKED and per-consumer advisory locks,
// and a wake through LISTEN/NOTIFY from another outbox object (as another process would be).
#include <gtest/gtest.h>

#include "../outbox_case.hpp"
#include "../postgres_test_support.hpp"
#include "idem/postgres/postgres_outbox.hpp"
#include "idem/postgres/postgres_recorder.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

using idem::test::OutboxFixture;

struct PostgresOutboxTest : ::testing::Test {
  idem::test::pg::TempSchema schema;
  std::shared_ptr<idem::postgres::ConnectionPool> pool =
      std::make_shared<idem::postgres::ConnectionPool>(schema.options());
  OutboxFixture f{std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(pool),
                  std::make_shared<idem::postgres::PostgresOutbox>(pool)};
};

TEST_F(PostgresOutboxTest, FollowUpsCommitAndRollBackWithTheMarker) {
  idem::test::outbox_commit_and_rollback_case(f);
}

TEST_F(PostgresOutboxTest, BinaryPayloadsSurvive) {
  idem::test::outbox_binary_payload_case(f);
}

TEST_F(PostgresOutboxTest, ABadFollowUpFailsTheHandler) {
  idem::test::outbox_bad_follow_up_case(f);
}

TEST_F(PostgresOutboxTest, RelayRepublishesAfterLostConfirmsAndDownstreamDedups) {
  idem::test::outbox_relay_through_bus_case(f);
}

TEST_F(PostgresOutboxTest, RefusedRowsAreParkedWithTheirReason) {
  idem::test::outbox_parking_case(f);
}

TEST_F(PostgresOutboxTest, RelayWakesOnCommit) {
  idem::test::outbox_relay_wakes_on_commit_case(f);
}

TEST_F(PostgresOutboxTest, ConcurrentRelaysPublishEachRowOnceInOrder) {
  // Outboxes with pools of their own, as separate relay processes would have.
  std::vector<std::shared_ptr<idem::Outbox>> relays = {f.outbox, f.outbox};
  for (int i = 0; i < 3; ++i)
    relays.push_back(std::make_shared<idem::postgres::PostgresOutbox>(schema.options()));
  idem::test::outbox_concurrent_relays_case(f, relays);
}

TEST_F(PostgresOutboxTest, AnotherProcessCommitWakesTheRelayThroughNotify) {
  // The relay's outbox object is not the handler's: only LISTEN/NOTIFY can wake it.
  auto relay_outbox = std::make_shared<idem::postgres::PostgresOutbox>(schema.options());
  EXPECT_FALSE(relay_outbox->wait_for_rows(std::chrono::milliseconds(10)));  // listening now
  idem::CollectingBusProxy proxy("billing");
  auto handler = idem::test::charging_handler(f, "billing", 1);
  ASSERT_EQ((*handler)(idem::test::incoming("n1"), proxy), idem::HandleResult::processed);
  EXPECT_TRUE(relay_outbox->wait_for_rows(std::chrono::seconds(30)));
}

}  // namespace
