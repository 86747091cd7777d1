// A key reused with other arguments across processes sharing one SQLite store: another process
// completed the key, or holds its claim right now, for other arguments. This process's call is
// refused with KeyReuseError naming the operation, the caller's key and the other claim, and
// runs nothing; with the same arguments it replays (or, reject policy, is told the key is in
// progress elsewhere). The other process is a fork()ed child that has not used idem before.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "../temp_dir.hpp"
#include "../thrown_by.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "worker/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using idem::test::ForkedChild;

struct Receipt {
  std::string id;
  int amount = 0;
};
void to_json(nlohmann::json& j, const Receipt& r) {
  j = {{"id", r.id}, {"amount", r.amount}};
}
void from_json(const nlohmann::json& j, Receipt& r) {
  j.at("id").get_to(r.id);
  j.at("amount").get_to(r.amount);
}

// create_payment on the SQLite store at `path`; `before` runs inside each execution first.
auto payments(const std::string& path, std::function<void()> before = nullptr,
              idem::InProgressPolicy in_progress = idem::InProgressPolicy::wait) {
  return idem::resilient(
      [before = std::move(before)](const std::string& request_id, int amount) {
        if (before) before();
        return Receipt{"rcpt-" + request_id + "-" + std::to_string(::getpid()), amount};
      },
      {.name = "create_payment",
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path),
       .idempotency_in_progress = in_progress});
}

TEST(SqliteKeyReuse, AKeyAnotherProcessCompletedWithOtherArgumentsIsRefused) {
  idem::test::TempDir dir;
  const std::string path = dir.file("payments.db");
  ForkedChild child([&] { return payments(path)("request-123", 2499).value.id; });
  const auto end = child.wait();
  ASSERT_EQ(end.status, 0) << end.report;
  const std::string receipt = end.report;

  std::atomic<int> runs{0};
  auto create_payment = payments(path, [&] { ++runs; });
  const auto reuse =
      idem::test::thrown_by<idem::KeyReuseError>([&] { create_payment("request-123", 1); });
  ASSERT_TRUE(reuse) << "expected KeyReuseError";
  const std::string message = reuse->what();
  EXPECT_EQ(reuse->key(), "request-123");
  EXPECT_EQ(reuse->operation(), "create_payment");
  EXPECT_NE(message.find("operation 'create_payment': idempotency key 'request-123' was first "
                         "used with different arguments"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("completed "), std::string::npos) << message;
  EXPECT_EQ(message.find("14:create_payment:"), std::string::npos) << message;
  const auto replay = create_payment("request-123", 2499);
  EXPECT_EQ(replay.value.id, receipt) << "the other process's result";
  EXPECT_EQ(replay.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(runs.load(), 0);
}

TEST(SqliteKeyReuse, AClaimAnotherProcessHoldsForOtherArgumentsIsRefused) {
  idem::test::TempDir dir;
  const std::string path = dir.file("payments.db");
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  // The child executes request-7 and holds its claim until the parent closes the gate.
  ForkedChild child([&](int report) {
    ::close(gate[1]);
    auto create_payment = payments(path, [&] {
      static_cast<void>(::write(report, "claimed", 7));
      char byte;
      static_cast<void>(::read(gate[0], &byte, 1));  // returns at EOF: the parent closed it
    });
    create_payment("request-7", 700);
  });
  ::close(gate[0]);
  ASSERT_TRUE(child.wait_for_report(60s)) << "the child never claimed the key";

  std::atomic<int> runs{0};
  auto create_payment = payments(path, [&] { ++runs; });
  const auto reuse =
      idem::test::thrown_by<idem::KeyReuseError>([&] { create_payment("request-7", 1); });
  EXPECT_TRUE(reuse) << "expected KeyReuseError";
  const std::string message = reuse ? reuse->what() : "";
  EXPECT_NE(message.find("operation 'create_payment': idempotency key 'request-7' is in "
                         "progress with different arguments"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("claim token "), std::string::npos) << message;
  EXPECT_NE(message.find("its lease runs until "), std::string::npos) << message;
  auto rejecting = payments(
      path, [&] { ++runs; }, idem::InProgressPolicy::reject);
  const auto held =
      idem::test::thrown_by<idem::AlreadyInProgress>([&] { rejecting("request-7", 700); });
  EXPECT_TRUE(held) << "expected AlreadyInProgress";
  const std::string held_message = held ? held->what() : "";
  EXPECT_NE(held_message.find("operation 'create_payment': idempotency key 'request-7' "
                              "is in progress in another process (claim token "),
            std::string::npos)
      << held_message;
  EXPECT_EQ(runs.load(), 0);
  ::close(gate[1]);
  const auto end = child.wait();
  EXPECT_EQ(end.status, 0) << end.report;
}

}  // namespace
