// `idem inspect --operation`, `idem list` and `idem release` run as processes (IDEM_CLI) on a
// SQLite file whose records an idem::resilient operation wrote: the user's key finds its
// record, a plain key that only matches a scoped record hints at --operation, listing pages
// through a prefix, and release clears abandoned claims, refuses live ones and results unless
// told, and fences the old holder off when forced.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/operation_idempotency.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "sqlite_cli_fixture.hpp"

namespace {

using idem::test::CliResult;
using std::chrono::hours;

class CliRecords : public idem::test::CliStoreCommands {
 protected:
  // A store on the test's file, at the real time.
  std::shared_ptr<idem::IdempotencyStore> store() {
    return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(db_.string(), options_at({}));
  }

  // Runs create_payment(request) once, as the README's operation does: its key is
  // "create-payment:" + request, under the operation's name.
  void pay(const std::shared_ptr<idem::IdempotencyStore>& on, const std::string& request) {
    auto create_payment = idem::resilient(
        [](const std::string& id) { return "receipt-" + id; },
        {.name = "create_payment",
         .idempotency_key = [](const std::string& id) { return "create-payment:" + id; },
         .idempotency_store = on});
    EXPECT_EQ(create_payment(request).value, "receipt-" + request);
  }

  // The stored key of the user's `key` of create_payment.
  static std::string stored(const std::string& key) {
    return idem::scoped_idempotency_key("create_payment", key);
  }
};

TEST_F(CliRecords, InspectFindsARecordByTheUsersKey) {
  pay(store(), "request-123");
  const CliResult found =
      run({"inspect", url_, "create-payment:request-123", "--operation", "create_payment"});
  ASSERT_EQ(found.code, 0) << found.err;
  EXPECT_NE(found.out.find("key           create-payment:request-123\n"
                           "scope         create_payment\n"
                           "stored as     14:create_payment:create-payment:request-123\n"
                           "state         completed\n"),
            std::string::npos)
      << found.out;
  const CliResult json =
      run({"inspect", url_, "create-payment:request-123", "--scope", "create_payment", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const auto out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["key"], "create-payment:request-123");
  EXPECT_EQ(out["scope"], "create_payment");
  EXPECT_EQ(out["stored_key"], stored("create-payment:request-123"));

  // The stored key itself still works, and is shown split.
  const CliResult raw = run({"inspect", url_, stored("create-payment:request-123")});
  ASSERT_EQ(raw.code, 0) << raw.err;
  EXPECT_NE(raw.out.find("scope         create_payment\n"), std::string::npos) << raw.out;
}

TEST_F(CliRecords, APlainKeyThatIsHeldUnderAnOperationGetsAHint) {
  pay(store(), "request-123");
  const CliResult plain = run({"inspect", url_, "create-payment:request-123"});
  EXPECT_EQ(plain.code, 1) << plain.err;
  EXPECT_NE(plain.err.find("no live record for key 'create-payment:request-123'"),
            std::string::npos)
      << plain.err;
  EXPECT_NE(plain.err.find("held by operation 'create_payment'"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("--operation create_payment"), std::string::npos) << plain.err;
  const CliResult other = run({"inspect", url_, "create-payment:request-999"});
  EXPECT_EQ(other.code, 1);
  EXPECT_EQ(other.err.find("--operation"), std::string::npos) << "no hint when nothing matches";
  const CliResult wrong =
      run({"inspect", url_, "create-payment:request-123", "--operation", "refund"});
  EXPECT_EQ(wrong.code, 1);
  EXPECT_NE(wrong.err.find("of operation 'refund'"), std::string::npos) << wrong.err;
  EXPECT_EQ(run({"inspect", url_, "k", "--operation", "a", "--scope", "b"}).code, 2);
}

TEST_F(CliRecords, ListPagesThroughAPrefix) {
  const auto on = store();
  for (int i = 0; i < 5; ++i)
    pay(on, "request-" + std::to_string(i));
  ASSERT_EQ(on->claim(stored("create-payment:running"), std::nullopt, hours(1)).status,
            idem::ClaimOutcome::Status::acquired);
  ASSERT_EQ(on->claim("unscoped-key", std::nullopt, hours(1)).status,
            idem::ClaimOutcome::Status::acquired);

  const CliResult all = run({"list", url_, "--operation", "create_payment"});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(all.out.rfind("KEY ", 0), 0u) << all.out;
  EXPECT_NE(all.out.find("create-payment:request-0  create_payment  completed "), std::string::npos)
      << all.out;
  EXPECT_NE(all.out.find("create-payment:running    create_payment  in_progress "),
            std::string::npos)
      << all.out;
  EXPECT_NE(all.out.find("lease until "), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("expires "), std::string::npos) << all.out;
  EXPECT_EQ(all.out.find("unscoped-key"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("\n6 records\n"), std::string::npos) << all.out;

  // Two at a time, following the cursor, until none follows.
  std::set<std::string> keys;
  std::vector<std::string> args = {"list",           url_,       "--operation",
                                   "create_payment", "--prefix", "create-payment:request-",
                                   "--limit",        "2",        "--json"};
  for (int page = 0; page < 10; ++page) {
    const CliResult result = run(args);
    ASSERT_EQ(result.code, 0) << result.err;
    const auto out = nlohmann::json::parse(result.out);
    EXPECT_LE(out["records"].size(), 2u);
    for (const auto& record : out["records"]) {
      EXPECT_EQ(record["scope"], "create_payment");
      EXPECT_EQ(record["state"], "completed");
      keys.insert(record["key"].get<std::string>());
    }
    if (out["next"].is_null()) break;
    args.resize(9);
    args.insert(args.end(), {"--cursor", out["next"].get<std::string>()});
  }
  EXPECT_EQ(keys.size(), 5u);

  const CliResult everything = run({"list", url_});
  ASSERT_EQ(everything.code, 0) << everything.err;
  const std::size_t line = everything.out.find("\nunscoped-key ");
  ASSERT_NE(line, std::string::npos) << everything.out;
  const std::string row =
      everything.out.substr(line + 1, everything.out.find('\n', line + 1) - line);
  EXPECT_NE(row.find(" -  "), std::string::npos) << "no scope: " << row;
  EXPECT_NE(row.find(" in_progress "), std::string::npos) << row;
  EXPECT_EQ(run({"list", url_, "--cursor", "zz"}).code, 2) << "a cursor idem never printed";
}

TEST_F(CliRecords, ReleaseClearsAnAbandonedClaim) {
  const auto on = store();
  const auto claim = on->claim(stored("create-payment:stuck"), std::nullopt, idem::Millis(1));
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  // Waits for the 1 ms lease to end (its deadline, not a guess).
  while (std::chrono::system_clock::now() <=
         on->lookup(stored("create-payment:stuck"))->lease_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));

  const CliResult released =
      run({"release", url_, "create-payment:stuck", "--operation", "create_payment"});
  ASSERT_EQ(released.code, 0) << released.err;
  EXPECT_NE(released.out.find("cleared the abandoned claim of key 'create-payment:stuck' of "
                              "operation 'create_payment'"),
            std::string::npos)
      << released.out;
  EXPECT_FALSE(on->lookup(stored("create-payment:stuck")).has_value());
  EXPECT_FALSE(
      on->complete(stored("create-payment:stuck"), claim.token, {{}, {}, "x"}, {}, hours(1)))
      << "the old holder is fenced off";
  EXPECT_EQ(run({"release", url_, "create-payment:stuck", "--operation", "create_payment"}).code, 1)
      << "nothing left to release";
}

TEST_F(CliRecords, ReleaseRefusesALiveClaimUnlessForcedAndThenFencesTheHolder) {
  const auto on = store();
  const std::string key = stored("create-payment:running");
  const auto claim = on->claim(key, std::nullopt, hours(1));
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);

  const CliResult refused =
      run({"release", url_, "create-payment:running", "--operation", "create_payment"});
  EXPECT_EQ(refused.code, 4) << refused.err;
  EXPECT_NE(refused.err.find("idem release: refused: the claim of key 'create-payment:running' "
                             "of operation 'create_payment' is live"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("nothing changed"), std::string::npos) << refused.err;
  ASSERT_TRUE(on->lookup(key).has_value());
  EXPECT_EQ(on->lookup(key)->token, claim.token);

  const CliResult forced =
      run({"release", url_, "create-payment:running", "--operation", "create_payment", "--force"});
  ASSERT_EQ(forced.code, 0) << forced.err;
  EXPECT_NE(forced.out.find("cleared the live claim"), std::string::npos) << forced.out;
  EXPECT_NE(forced.out.find("fenced off"), std::string::npos) << forced.out;
  EXPECT_FALSE(on->lookup(key).has_value());
  // The holder, still running, can neither complete nor release with its token, even once the
  // key is claimed again.
  EXPECT_FALSE(on->renew(key, claim.token, hours(1)));
  EXPECT_FALSE(on->complete(key, claim.token, {{}, {}, "late"}, {}, hours(1)));
  EXPECT_FALSE(on->release(key, claim.token));
  const auto next = on->claim(key, std::nullopt, hours(1));
  ASSERT_EQ(next.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(next.token, claim.token);
  EXPECT_FALSE(on->complete(key, claim.token, {{}, {}, "late"}, {}, hours(1)));
  EXPECT_TRUE(on->complete(key, next.token, {{}, {}, "fresh"}, {}, hours(1)));
}

TEST_F(CliRecords, ReleaseTouchesACompletedResultOnlyWhenTold) {
  const auto on = store();
  pay(on, "request-7");
  for (const char* force : {"--operation", "--force"}) {
    std::vector<std::string> args = {"release", url_, "create-payment:request-7", "--operation",
                                     "create_payment"};
    if (std::string(force) == "--force") args.push_back("--force");
    const CliResult refused = run(args);
    EXPECT_EQ(refused.code, 4) << refused.err;
    EXPECT_NE(refused.err.find("holds a completed result"), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("--delete-completed"), std::string::npos) << refused.err;
    EXPECT_TRUE(on->lookup(stored("create-payment:request-7")).has_value());
  }
  const CliResult deleted = run({"release", url_, "create-payment:request-7", "--operation",
                                 "create_payment", "--delete-completed"});
  ASSERT_EQ(deleted.code, 0) << deleted.err;
  EXPECT_NE(deleted.out.find("deleted the completed result"), std::string::npos) << deleted.out;
  EXPECT_FALSE(on->lookup(stored("create-payment:request-7")).has_value());

  const CliResult missing = run({"release", url_, "create-payment:request-7"});
  EXPECT_EQ(missing.code, 1) << missing.err;
  EXPECT_NE(missing.err.find("not found"), std::string::npos) << missing.err;
}

}  // namespace
