// Internal: the recorder's and the store's calls as steps without I/O — the statement to run
// next and what its result means — written once for both faces. The blocking classes
// (postgres_recorder.cpp, postgres_store.cpp) drive them with a short loop over a pooled
// Connection, the coroutine ones (async_postgres.cpp) with a short coroutine loop over the
// pipelined AsyncConnection; neither decides anything itself, so a blocking and a coroutine
// caller on one database agree call for call. (The Redis backend's operations.hpp is the same
// idea; boost.redis calls them *_fsm.) Not installed.
//
// Thread-safety: a step object is used by one call; it references the SQL, the clock and the
// arguments it was given, which must outlive it.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "connection.hpp"
#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"
#include "sql_text.hpp"

namespace idem::postgres::detail {

// One statement to run: idem's own (binary results), or SQL text without parameters (text
// results) when `statement` is null.
struct Step {
  const Statement* statement = nullptr;
  std::string_view sql;
  Params params;
  StatementKind kind = StatementKind::read;
  // What the result says, for the calls that answer yes or no.
  bool (*answer)(const Result& result) = nullptr;
};

// The blocking face's runner: `step` on `connection` (a statement prepared there on first use, or
// SQL text). Throws the classified PostgresError.
Result run_step(Connection& connection, const Step& step, std::string_view call);

// The blocking faces' calls of one statement: each on a connection of `pool`, leased for the
// call. A failure that leaves the connection unusable drops it when the lease ends.
struct PooledRunner {
  explicit PooledRunner(std::shared_ptr<ConnectionPool> shared_pool)
      : pool(std::move(shared_pool)) {}

  Result run(const Statement& statement, const Params& params, std::string_view call,
             StatementKind kind) const;
  Result run(const Step& step, std::string_view call) const;
  bool answer(const Step& step, std::string_view call) const {
    return step.answer(run(step, call));
  }

  std::shared_ptr<ConnectionPool> pool;
};

// ---- one statement, one answer ---------------------------------------------------------------
// (The caller has checked the keys, and answers false itself for a token that does not fit a
// bigint: fits_token().)

Step recorder_is_processed(const RecorderSql& sql, std::string_view consumer,
                           std::string_view event_id);
Step recorder_mark(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                   WallTime now);
Step recorder_complete(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                       std::uint64_t token, WallTime now);
Step recorder_release(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                      std::uint64_t token);
Step recorder_renew(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                    std::uint64_t token, WallTime lease_until);

// complete (a TTL of 0 drops the claim instead: nothing to keep), release, renew.
Step store_complete(const StoreSql& sql, std::string_view key, std::uint64_t token,
                    std::string_view value, const ExecutionReport& report, WallTime now,
                    Millis ttl);
Step store_release(const StoreSql& sql, std::string_view key, std::uint64_t token);
Step store_renew(const StoreSql& sql, std::string_view key, std::uint64_t token,
                 WallTime lease_until);
// lookup: the record, or nullopt when absent or expired at `now`.
Step store_lookup(const StoreSql& sql, std::string_view key);
std::optional<IdempotencyRecord> store_lookup_answer(const StoreSql& sql, std::string_view key,
                                                     const Result& result, WallTime now);

// ---- claims: a few rounds -------------------------------------------------------------------
// Run step(); give its result to read(): true when outcome() is the answer, false when step()
// is the next statement to run. After kClaimRounds rounds that other writers kept changing,
// read() throws the retryable store_busy PostgresError.

class RecorderClaim {
 public:
  RecorderClaim(const RecorderSql& sql, const Clock& clock, std::string_view consumer,
                std::string_view event_id, Millis lease, std::string_view call,
                const std::string& target);
  const Step& step() const noexcept { return step_; }
  bool read(const Result& result);
  Claim& outcome() noexcept { return outcome_; }

 private:
  void claim_round();

  const RecorderSql& sql_;
  const Clock& clock_;
  std::string_view consumer_;
  std::string_view event_id_;
  Millis lease_;
  std::string_view call_;
  const std::string& target_;
  WallTime now_{};
  int round_ = 0;
  bool rereading_ = false;
  Step step_;
  Claim outcome_;
};

class StoreClaim {
 public:
  StoreClaim(const StoreSql& sql, const Clock& clock, std::string_view key,
             std::optional<std::string_view> fingerprint, Millis lease, std::string_view call,
             const std::string& target);
  const Step& step() const noexcept { return step_; }
  bool read(const Result& result);
  ClaimOutcome& outcome() noexcept { return outcome_; }

 private:
  void claim_round();

  const StoreSql& sql_;
  const Clock& clock_;
  std::string_view key_;
  std::optional<std::string_view> fingerprint_;
  Millis lease_;
  std::string_view call_;
  const std::string& target_;
  WallTime now_{};
  int round_ = 0;
  bool rereading_ = false;
  Step step_;
  ClaimOutcome outcome_;
};

// ---- the transactional mark ------------------------------------------------------------------
// run_transactional() as steps: BEGIN; the mark (already processed: done, false; claimed by
// another delivery: the reread decides between done and AlreadyInProgress); the handler; its
// session's transaction status (a statement of it failed: 25P02; it ended idem's transaction
// itself: in doubt, the session is closed); COMMIT (answered ROLLBACK: retryable); done, true.
//
// The driver: while action() is send, run step() and give its result to read(); at
// run_handler, run the handler, then handler_ran(status of the session); at done, ran() is the
// answer. Any way out while in_transaction() (BEGIN sent, COMMIT not) rolls back — off the
// caller's path on the coroutine face; broken() says the session's state is unknown (close it).
// read() and handler_ran() throw the call's errors.
class TransactionalMark {
 public:
  enum class Action { send, run_handler, done };

  TransactionalMark(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                    WallTime now, std::string_view call, const std::string& target);

  Action action() const noexcept { return action_; }
  const Step& step() const noexcept { return step_; }
  void read(const Result& result);
  void handler_ran(PGTransactionStatusType status);

  bool ran() const noexcept { return ran_; }
  bool in_transaction() const noexcept { return in_transaction_; }
  bool broken() const noexcept {
    return broken_ || (action_ == Action::send && sent_ == Sent::commit);  // COMMIT unanswered
  }

 private:
  enum class Sent { begin, mark, reread, commit };
  void send(Sent what, Step step);

  const RecorderSql& sql_;
  std::string_view consumer_;
  std::string_view event_id_;
  WallTime now_;
  std::string_view call_;
  const std::string& target_;
  Action action_ = Action::send;
  Sent sent_ = Sent::begin;
  Step step_;
  bool ran_ = false;
  bool in_transaction_ = true;  // BEGIN is the first step: a ROLLBACK is harmless at worst
  bool broken_ = false;
};

}  // namespace idem::postgres::detail
