#include "steps.hpp"

#include <utility>

#include "claim_logic.hpp"
#include "idem/error.hpp"
#include "pool_access.hpp"
#include "record_decoder.hpp"

namespace idem::postgres::detail {

namespace {

bool has_rows(const Result& result) {
  return result.rows() > 0;
}
bool changed_rows(const Result& result) {
  return result.affected() > 0;
}
bool counted(const Result& result) {
  return result.int8(0, 0) > 0;
}

Step statement(const Statement& statement, Params params, StatementKind kind,
               bool (*answer)(const Result&) = nullptr) {
  Step step;
  step.statement = &statement;
  step.params = std::move(params);
  step.kind = kind;
  step.answer = answer;
  return step;
}

Step text(std::string_view sql, StatementKind kind) {
  Step step;
  step.sql = sql;
  step.kind = kind;
  return step;
}

Params marker_key(std::string_view consumer, std::string_view event_id) {
  Params params;
  params.text(consumer).text(event_id);
  return params;
}

}  // namespace

Result run_step(Connection& connection, const Step& step, std::string_view call) {
  if (step.statement != nullptr)
    return connection.run(*step.statement, step.params, call, step.kind);
  return connection.exec(step.sql, call, step.kind);
}

Result PooledRunner::run(const Statement& statement, const Params& params, std::string_view call,
                         StatementKind kind) const {
  ConnectionPool::Lease lease = pool->acquire();
  return detail::PoolAccess::connection(lease).run(statement, params, call, kind);
}

Result PooledRunner::run(const Step& step, std::string_view call) const {
  ConnectionPool::Lease lease = pool->acquire();
  return run_step(detail::PoolAccess::connection(lease), step, call);
}

// ---- one statement, one answer ---------------------------------------------------------------

Step recorder_is_processed(const RecorderSql& sql, std::string_view consumer,
                           std::string_view event_id) {
  return statement(sql.select_marker, marker_key(consumer, event_id), StatementKind::read,
                   &has_rows);
}

Step recorder_mark(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                   WallTime now) {
  Params params = marker_key(consumer, event_id);
  params.timestamptz(now);
  return statement(sql.insert_marker, std::move(params), StatementKind::write);
}

Step recorder_complete(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                       std::uint64_t token, WallTime now) {
  Params params = marker_key(consumer, event_id);
  params.int8(static_cast<std::int64_t>(token)).timestamptz(now);
  return statement(sql.complete, std::move(params), StatementKind::write, &counted);
}

Step recorder_release(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                      std::uint64_t token) {
  Params params = marker_key(consumer, event_id);
  params.int8(static_cast<std::int64_t>(token));
  return statement(sql.release, std::move(params), StatementKind::write, &changed_rows);
}

Step recorder_renew(const RecorderSql& sql, std::string_view consumer, std::string_view event_id,
                    std::uint64_t token, WallTime lease_until) {
  Params params = marker_key(consumer, event_id);
  params.int8(static_cast<std::int64_t>(token)).timestamptz(lease_until);
  return statement(sql.renew, std::move(params), StatementKind::write, &changed_rows);
}

Step store_complete(const StoreSql& sql, std::string_view key, std::uint64_t token,
                    std::string_view value, const ExecutionReport& report, WallTime now,
                    Millis ttl) {
  Params params;
  if (ttl == Millis::zero()) {
    // Expired the instant it completes: nothing to keep (as the in-memory store does).
    params.text(key).int8(static_cast<std::int64_t>(token)).text(sql.channel);
    return statement(sql.drop, std::move(params), StatementKind::write, &has_rows);
  }
  params.text(key)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(now)
      .timestamptz(add_saturating(now, ttl))
      .bytea(value)
      .text(report.to_json())
      .text(sql.channel);
  return statement(sql.complete, std::move(params), StatementKind::write, &has_rows);
}

Step store_release(const StoreSql& sql, std::string_view key, std::uint64_t token) {
  Params params;
  params.text(key).int8(static_cast<std::int64_t>(token)).text(sql.channel);
  return statement(sql.drop, std::move(params), StatementKind::write, &has_rows);
}

Step store_renew(const StoreSql& sql, std::string_view key, std::uint64_t token,
                 WallTime lease_until) {
  Params params;
  params.text(key).int8(static_cast<std::int64_t>(token)).timestamptz(lease_until);
  return statement(sql.renew, std::move(params), StatementKind::write, &changed_rows);
}

Step store_lookup(const StoreSql& sql, std::string_view key) {
  Params params;
  params.text(key);
  return statement(sql.lookup, std::move(params), StatementKind::read);
}

std::optional<IdempotencyRecord> store_lookup_answer(const StoreSql& sql, std::string_view key,
                                                     const Result& result, WallTime now) {
  if (result.rows() == 0) return std::nullopt;
  IdempotencyRecord record = decode_record(key, sql.table_name, result, 0, 0);
  if (record.state == IdempotencyRecord::State::completed && now >= record.expires_at) {
    return std::nullopt;  // expired: absent, whatever the table still holds
  }
  return record;
}

// ---- claims ---------------------------------------------------------------------------------

RecorderClaim::RecorderClaim(const RecorderSql& sql, const Clock& clock, std::string_view consumer,
                             std::string_view event_id, Millis lease, std::string_view call,
                             const std::string& target)
    : sql_(sql),
      clock_(clock),
      consumer_(consumer),
      event_id_(event_id),
      lease_(lease),
      call_(call),
      target_(target) {
  claim_round();
}

void RecorderClaim::claim_round() {
  if (round_++ == kClaimRounds) throw_recorder_claim_busy(call_, target_, consumer_, event_id_);
  now_ = clock_.wall_now();
  Params params = marker_key(consumer_, event_id_);
  params.timestamptz(now_).timestamptz(add_saturating(now_, lease_));
  step_ = statement(sql_.claim, std::move(params), StatementKind::write);
  rereading_ = false;
}

bool RecorderClaim::read(const Result& result) {
  if (!rereading_) {
    if (auto decided = recorder_claim_decision(result, now_)) {
      outcome_ = *decided;
      return true;
    }
    // Another writer got there first: look again with a fresh snapshot.
    step_ = statement(sql_.reread, marker_key(consumer_, event_id_), StatementKind::read);
    rereading_ = true;
    return false;
  }
  if (auto decided = recorder_reread_decision(result, now_)) {
    outcome_ = *decided;
    return true;
  }
  claim_round();  // released (or its lease passed) in between: claim again
  return false;
}

StoreClaim::StoreClaim(const StoreSql& sql, const Clock& clock, std::string_view key,
                       std::optional<std::string_view> fingerprint, Millis lease,
                       std::string_view call, const std::string& target)
    : sql_(sql),
      clock_(clock),
      key_(key),
      fingerprint_(fingerprint),
      lease_(lease),
      call_(call),
      target_(target) {
  claim_round();
}

void StoreClaim::claim_round() {
  if (round_++ == kClaimRounds) throw_store_claim_busy(call_, target_, key_);
  now_ = clock_.wall_now();
  step_ = statement(sql_.claim, store_claim_params(key_, fingerprint_, now_, lease_),
                    StatementKind::write);
  rereading_ = false;
}

bool StoreClaim::read(const Result& result) {
  std::optional<IdempotencyRecord> record;
  if (!rereading_) {
    if (auto acquired = store_acquired(result)) {
      outcome_ = std::move(*acquired);
      return true;
    }
    if (result.rows() > 0) {
      record = decode_record(key_, sql_.table_name, result, 0, kClaimLeadingColumns);
    }
    if (!record || !is_live(*record, now_)) {
      // The statement's snapshot saw no record, or a dead one, and yet the claim did not go
      // through: another writer changed the row meanwhile. Read it again, fresh.
      Params again;
      again.text(key_);
      step_ = statement(sql_.lookup, std::move(again), StatementKind::read);
      rereading_ = true;
      return false;
    }
  } else {
    if (result.rows() > 0) record = decode_record(key_, sql_.table_name, result, 0, 0);
    if (!record || !is_live(*record, now_)) {
      claim_round();  // gone or dead again: claim again
      return false;
    }
  }
  outcome_ = ClaimOutcome::found(std::move(*record), fingerprint_);
  return true;
}

// ---- the transactional mark ------------------------------------------------------------------

TransactionalMark::TransactionalMark(const RecorderSql& sql, std::string_view consumer,
                                     std::string_view event_id, WallTime now, std::string_view call,
                                     const std::string& target)
    : sql_(sql), consumer_(consumer), event_id_(event_id), now_(now), call_(call), target_(target) {
  send(Sent::begin, text("BEGIN", StatementKind::read));
}

void TransactionalMark::send(Sent what, Step step) {
  action_ = Action::send;
  sent_ = what;
  step_ = std::move(step);
}

void TransactionalMark::read(const Result& result) {
  switch (sent_) {
    case Sent::begin: {
      Params params = marker_key(consumer_, event_id_);
      params.timestamptz(now_);
      send(Sent::mark, statement(sql_.transactional_mark, std::move(params), StatementKind::read));
      return;
    }
    case Sent::mark:
      if (result.int8(0, 0) == 0) {
        action_ = Action::done;  // already processed: roll back, do not run
        return;
      }
      if (result.int8(0, 1) == 0) {
        send(Sent::reread,
             statement(sql_.reread, marker_key(consumer_, event_id_), StatementKind::read));
        return;
      }
      action_ = Action::run_handler;
      return;
    case Sent::reread:
      if (!result.is_null(0, 1) && result.boolean(0, 2)) {
        action_ = Action::done;  // done by a claim
        return;
      }
      throw AlreadyInProgress("(" + std::string(consumer_) + ", " + std::string(event_id_) +
                              ") is claimed by another delivery whose lease has not passed");
    case Sent::commit:
      action_ = Action::done;
      // COMMIT of a transaction the server had already aborted answers ROLLBACK, not an error.
      if (std::string_view(PQcmdStatus(result.get())) != "COMMIT") {
        throw PostgresError(ErrorCode::store_error,
                            std::string(call_) + " on " + target_ +
                                ": the server rolled the transaction back at COMMIT",
                            "", /*retryable=*/true, false);
      }
      ran_ = true;
      return;
  }
}

void TransactionalMark::handler_ran(PGTransactionStatusType status) {
  const std::string who =
      "the handler for (" + std::string(consumer_) + ", " + std::string(event_id_) + ")";
  switch (status) {
    case PQTRANS_INTRANS:
      in_transaction_ = false;  // from here on, a way out does not roll back: COMMIT is sent
      send(Sent::commit, text("COMMIT", StatementKind::commit));
      return;
    case PQTRANS_INERROR:
      throw PostgresError(ErrorCode::store_error,
                          std::string(call_) + " on " + target_ + ": a statement of " + who +
                              " failed and the handler went on; the transaction was rolled back "
                              "(nothing was marked)",
                          "25P02", /*retryable=*/false, false);
    case PQTRANS_ACTIVE:
      // A statement of the handler's was still in the pipeline when it returned (it was
      // cancelled and the handler went on): the session is closed, so the server rolls back.
      broken_ = true;
      throw PostgresError(ErrorCode::store_error,
                          std::string(call_) + " on " + target_ + ": a statement of " + who +
                              " was still running when it returned; the transaction was rolled "
                              "back (nothing was marked)",
                          "", /*retryable=*/false, false);
    default:
      broken_ = true;
      in_transaction_ = false;
      throw PostgresError(ErrorCode::store_error,
                          std::string(call_) + " on " + target_ + ": " + who +
                              " ended idem's transaction itself (COMMIT/ROLLBACK through its "
                              "connection); whether its writes and the marker were committed "
                              "is unknown",
                          "", /*retryable=*/false, /*in_doubt=*/true);
  }
}

}  // namespace idem::postgres::detail
