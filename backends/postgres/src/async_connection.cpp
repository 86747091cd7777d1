#include "async_connection.hpp"

#include <asio/post.hpp>
#include <system_error>
#include <utility>

#include "idem/error.hpp"

namespace idem::postgres::detail {

namespace {

using async::detail::operation_aborted;

// A query whose connection went away after it was sent: classified like the blocking backend's
// lost connection (a write or COMMIT is in doubt).
std::exception_ptr lost_error(const Query& query, const std::string& target, std::string_view why) {
  const ErrorClass cls = classify_error("", /*connection_lost=*/true, query.kind);
  std::string text =
      std::string(query.call) + " on " + target + ": " + std::string(why) + " (connection lost)";
  if (cls.in_doubt) {
    text += query.kind == StatementKind::commit ? "; whether the transaction committed is unknown"
                                                : "; whether the statement took effect is unknown";
  }
  return std::make_exception_ptr(PostgresError(cls.code, text, "", cls.retryable, cls.in_doubt));
}

// A query cancelled by its caller after it was sent.
std::exception_ptr cancelled_after_send(const Query& query, const std::string& target) {
  if (query.kind == StatementKind::read) return operation_aborted();
  const bool commit = query.kind == StatementKind::commit;
  return std::make_exception_ptr(PostgresError(
      ErrorCode::store_error,
      std::string(query.call) + " on " + target + ": cancelled after the statement was sent; " +
          (commit ? "whether the transaction committed is unknown"
                  : "whether the statement took effect is unknown"),
      "", /*retryable=*/!commit, /*in_doubt=*/true));
}

}  // namespace

AsyncConnection::AsyncConnection(asio::any_io_executor executor, const PostgresOptions& options,
                                 std::string target)
    : Pipeline(executor), options_(options), target_(std::move(target)) {
  if (options_.statement_timeout > std::chrono::milliseconds::zero()) {
    set_timeout_sql_ =
        "SET statement_timeout = " + std::to_string(options_.statement_timeout.count());
  }
}

AsyncConnection::~AsyncConnection() {
  teardown();
}

std::exception_ptr AsyncConnection::cancel_sent(const PgCall& call,
                                                asio::cancellation_type type) const {
  // A write or COMMIT may have taken effect: only a cancellation that accepts that ends it now.
  if (call.query.kind != StatementKind::read && !async::detail::allows_side_effects(type)) {
    return nullptr;  // it ends with its real outcome
  }
  return cancelled_after_send(call.query, target_);
}

void AsyncConnection::reset() {
  asio::post(get_executor(), [self = shared_from_this()] {
    if (!self->has_in_flight() && !self->has_queued()) {
      self->teardown();
    } else {
      self->reset_pending_ = true;
    }
  });
}

// ---- connecting ----------------------------------------------------------------------------

void AsyncConnection::pump() {
  if (!has_queued() && !has_in_flight()) return;
  if (phase_ == Phase::down) {
    if (has_queued()) start_connect();
    return;
  }
  if (phase_ == Phase::connecting) return;
  if (reset_pending_) return;  // draining before a reset: new queries wait for the new session
  if (doomed_ && has_in_flight()) return;  // likewise for a session that is ending
  if (!has_in_flight() && !idle_connection_healthy()) {
    // The server closed the session while it was idle (restart, terminated): nothing was sent,
    // so reconnect instead of failing the query.
    teardown();
    start_connect();
    return;
  }
  while (has_queued()) {
    if (!send(send_next().call)) {
      lost(PQerrorMessage(conn_));
      return;
    }
  }
  flush();
  if (phase_ == Phase::up && has_in_flight()) arm_read();
}

void AsyncConnection::start_connect() {
  phase_ = Phase::connecting;
  doomed_ = false;
  try {
    conn_ = connect_start(options_);
  } catch (...) {
    phase_ = Phase::down;
    std::exception_ptr failure = std::current_exception();
    fail_queued([&](const Pending&) { return failure; });
    return;
  }
  if (PQstatus(conn_) == CONNECTION_BAD) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  timer().expires_after(options_.connect_timeout);
  when_timer([](AsyncConnection& self, const asio::error_code& ec) {
    if (ec || self.phase_ != Phase::connecting) return;
    self.connect_failed(connect_timeout_error(self.options_, self.target_, self.conn_));
  });
  connect_step(PGRES_POLLING_WRITING);
}

void AsyncConnection::connect_step(PostgresPollingStatusType status) {
  const int fd = PQsocket(conn_);
  if (fd < 0) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  // The socket can change within PQconnectPoll (libpq closes one and opens the next for another
  // host or address of the URL), even to one with the same number: watched afresh at each step.
  try {
    watch(fd);
  } catch (const std::system_error& e) {
    connect_failed(connect_error(e.what(), target_));
    return;
  }
  when_ready(status == PGRES_POLLING_READING ? WaitType::wait_read : WaitType::wait_write,
             [](AsyncConnection& self, const asio::error_code& ec) { self.on_connect_ready(ec); });
}

void AsyncConnection::on_connect_ready(const asio::error_code& ec) {
  if (phase_ != Phase::connecting) return;
  if (ec) {
    connect_failed(connect_error(ec.message(), target_));
    return;
  }
  const PostgresPollingStatusType next = PQconnectPoll(conn_);
  if (next == PGRES_POLLING_FAILED) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  if (next == PGRES_POLLING_OK) {
    connected();
    return;
  }
  connect_step(next);
}

void AsyncConnection::connected() {
  timer().cancel();
  PQsetErrorVerbosity(conn_, PQERRORS_DEFAULT);
  PQsetNoticeReceiver(conn_, &AsyncConnection::on_notice, this);
  if (PQsetnonblocking(conn_, 1) != 0 || PQenterPipelineMode(conn_) != 1) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  phase_ = Phase::up;
  connects_.fetch_add(1);
  if (!set_timeout_sql_.empty()) {
    // The connection's own (no caller): first in the pipeline, before any caller's statement.
    if (!send(send_own(
                  PgCall(Query{nullptr, set_timeout_sql_, nullptr, "connect", StatementKind::read}))
                  .call)) {
      lost(PQerrorMessage(conn_));
      return;
    }
  }
  pump();
}

void AsyncConnection::connect_failed(const PostgresError& error) {
  teardown();
  std::exception_ptr failure = std::make_exception_ptr(error);
  fail_queued([&](const Pending&) { return failure; });
}

// ---- the pipeline ---------------------------------------------------------------------------

bool AsyncConnection::send(PgCall& call) {
  const Query& q = call.query;
  static const Params kNone;
  const Params& params = q.params != nullptr ? *q.params : kNone;
  const Params::Arrays a = params.arrays();
  int ok = 0;
  if (q.statement != nullptr && q.statement->planning == Planning::prepared) {
    if (prepared_.count(q.statement->name) == 0) {
      if (PQsendPrepare(conn_, q.statement->name.c_str(), q.statement->sql.c_str(),
                        static_cast<int>(q.statement->types.size()),
                        q.statement->types.data()) != 1) {
        return false;
      }
      prepared_.insert(q.statement->name);
      call.sent_prepare = true;
    }
    ok = PQsendQueryPrepared(conn_, q.statement->name.c_str(), params.size(), a.values.data(),
                             a.lengths.data(), a.formats.data(), /*resultFormat=*/1);
  } else if (q.statement != nullptr) {
    ok =
        PQsendQueryParams(conn_, q.statement->sql.c_str(), params.size(), q.statement->types.data(),
                          a.values.data(), a.lengths.data(), a.formats.data(), /*resultFormat=*/1);
  } else {
    const std::string text(q.sql);
    ok = PQsendQueryParams(conn_, text.c_str(), params.size(), params.types(), a.values.data(),
                           a.lengths.data(), a.formats.data(), /*resultFormat=*/0);
  }
  return ok == 1 && PQpipelineSync(conn_) == 1;
}

void AsyncConnection::flush() {
  if (phase_ != Phase::up) return;
  const int flushed = PQflush(conn_);
  if (flushed < 0) {
    lost(PQerrorMessage(conn_));
    return;
  }
  if (flushed == 1) arm_write();
}

void AsyncConnection::arm_read() {
  when_readable([](AsyncConnection& self, const asio::error_code& ec) { self.on_readable(ec); });
}

void AsyncConnection::arm_write() {
  when_writable(WaitType::wait_write, [](AsyncConnection& self, const asio::error_code& ec) {
    if (ec) {
      self.lost(ec.message());
      return;
    }
    self.flush();
  });
}

void AsyncConnection::on_readable(const asio::error_code& ec) {
  if (ec) {
    lost(ec.message());
    return;
  }
  if (PQconsumeInput(conn_) == 0) {
    lost(PQerrorMessage(conn_));
    return;
  }
  drain();
  if (phase_ != Phase::up) return;
  if (PQstatus(conn_) != CONNECTION_OK) {
    lost(PQerrorMessage(conn_));
    return;
  }
  if (!write_waiting()) flush();  // libpq may have more to send once it could read
  if (phase_ != Phase::up) return;
  if (has_in_flight()) {
    arm_read();
  } else if (reset_pending_ || doomed_) {
    reset_pending_ = false;
    teardown();
    pump();  // queries that waited for the reset
  } else {
    pump();
  }
}

void AsyncConnection::drain() {
  int nulls = 0;
  while (has_in_flight() && PQisBusy(conn_) == 0) {
    PGresult* raw = PQgetResult(conn_);
    if (raw == nullptr) {
      if (++nulls >= 2) break;  // nothing more has arrived
      continue;
    }
    nulls = 0;
    Result result(raw);
    PgCall& call = oldest().call;
    const ExecStatusType status = PQresultStatus(raw);
    if (status == PGRES_PIPELINE_SYNC) {
      transaction_status_.store(PQtransactionStatus(conn_));
      Entry done = pop_oldest();
      if (done->call.prepare_failed) prepared_.erase(done->call.query.statement->name);
      if (done->call.error.get() != nullptr) {
        // A standby's session: reopened once the queries in flight are answered.
        if (refuses_writes(done->call.error.get())) doomed_ = true;
        std::exception_ptr error = std::make_exception_ptr(make_error(
            conn_, done->call.error.get(), done->call.query.call, target_, done->call.query.kind));
        complete(*done, std::move(error), Result{});
      } else {
        complete(*done, nullptr, std::move(done->call.result));
      }
      continue;
    }
    const bool first = call.results_seen++ == 0;
    if (status == PGRES_PIPELINE_ABORTED) continue;
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE ||
        status == PGRES_NONFATAL_ERROR) {
      if (first && call.sent_prepare) call.prepare_failed = true;
      if (call.error.get() == nullptr) call.error = std::move(result);
      continue;
    }
    call.result = std::move(result);
  }
}

void AsyncConnection::lost(std::string_view why) {
  const std::string message = why.empty() ? std::string("the connection was lost")
                                          : std::string(why.substr(0, why.find('\n')));
  teardown();
  reset_pending_ = false;
  fail_in_flight(
      [&](const Pending& pending) { return lost_error(pending.call.query, target_, message); });
  pump();  // queries not sent yet go to a new session
}

void AsyncConnection::teardown() noexcept {
  end_transport();
  close_transport();
}

void AsyncConnection::close_transport() noexcept {
  phase_ = Phase::down;
  prepared_.clear();
  // libpq owns the descriptor: the engine stopped watching it (end_transport()) before
  // PQfinish closes it.
  if (conn_ != nullptr) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
}

bool AsyncConnection::idle_connection_healthy() {
  return idle_session_healthy(conn_, doomed_);
}

void AsyncConnection::on_notice(void* self, const PGresult* notice) {
  if (ends_session(notice)) static_cast<AsyncConnection*>(self)->doomed_ = true;
}

}  // namespace idem::postgres::detail
