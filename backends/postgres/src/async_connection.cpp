#include "async_connection.hpp"

#include <poll.h>

#include <asio/error.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>
#include <asio/system_error.hpp>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/error.hpp"

namespace idem::postgres::detail {

namespace {

std::exception_ptr aborted() {
  return std::make_exception_ptr(asio::system_error(asio::error::operation_aborted));
}

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
  if (query.kind == StatementKind::read) return aborted();
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
    : strand_(asio::make_strand(std::move(executor))),
      registry_(async::detail::ShutdownRegistry<AsyncConnection>::of(strand_.get_inner_executor())),
      options_(options),
      target_(std::move(target)),
      connect_timer_(strand_) {
  if (options_.statement_timeout > std::chrono::milliseconds::zero()) {
    set_timeout_sql_ =
        "SET statement_timeout = " + std::to_string(options_.statement_timeout.count());
  }
  registry_.add(this);
}

AsyncConnection::~AsyncConnection() {
  registry_.remove(this);
  teardown();
}

void AsyncConnection::submit(std::shared_ptr<Request> request) {
  if (request->state == Request::State::done) return;  // cancelled before it got here
  const bool was_idle = queued_.empty() && in_flight_.empty();
  queued_.push_back(std::move(request));
  if (phase_ == Phase::up && was_idle && !idle_connection_healthy()) {
    // The server closed the session while it was idle (restart, terminated): nothing was sent,
    // so reconnect instead of failing the query.
    teardown();
  }
  // Statements submitted in the same turn of the event loop go out in one write.
  if (!pump_scheduled_) {
    pump_scheduled_ = true;
    asio::post(strand_, [self = shared_from_this()] {
      self->pump_scheduled_ = false;
      self->pump();
    });
  }
}

void AsyncConnection::cancel(const std::shared_ptr<Request>& request) {
  if (request->state == Request::State::done) return;
  if (request->state == Request::State::queued) {
    for (auto it = queued_.begin(); it != queued_.end(); ++it) {
      if (*it == request) {
        queued_.erase(it);
        break;
      }
    }
    finish(*request, aborted(), Result{});
    if (queued_.empty() && phase_ == Phase::connecting && in_flight_.empty()) {
      // Nobody waits for the connection any more; let the attempt finish anyway (it is bounded
      // by connect_timeout) so the next query finds it ready.
    }
    return;
  }
  // Sent: the result is read and dropped when it comes; the caller hears now.
  std::exception_ptr error = cancelled_after_send(request->query, target_);
  if (request->completion) {
    // Moved, not copied: the caller's executor then holds the only reference, so the error is
    // released where it is read and not on this strand after the caller has seen it.
    request->completion->complete(std::move(error), Result{});
    request->completion.reset();
    load_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void AsyncConnection::finish(Request& request, std::exception_ptr error, Result result) {
  request.state = Request::State::done;
  if (!request.completion) return;  // internal, or its caller was cancelled
  request.completion->complete(std::move(error), std::move(result));
  request.completion.reset();
  load_.fetch_sub(1, std::memory_order_relaxed);
}

void AsyncConnection::reset() {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->in_flight_.empty() && self->queued_.empty()) {
      self->teardown();
    } else {
      self->reset_pending_ = true;
    }
  });
}

void AsyncConnection::shut_down() {
  asio::post(strand_, [self = shared_from_this()] {
    auto queued = std::move(self->queued_);
    auto in_flight = std::move(self->in_flight_);
    self->queued_.clear();
    self->in_flight_.clear();
    self->teardown();
    for (auto& r : queued)
      self->finish(*r, aborted(), Result{});
    for (auto& r : in_flight)
      self->finish(*r, aborted(), Result{});
  });
}

void AsyncConnection::abandon() noexcept {
  auto queued = std::move(queued_);
  auto in_flight = std::move(in_flight_);
  queued_.clear();
  in_flight_.clear();
  teardown();
  load_.store(0, std::memory_order_relaxed);
  // `queued` and `in_flight` go here, with the handlers (and coroutine frames) they own.
}

// ---- connecting ----------------------------------------------------------------------------

void AsyncConnection::pump() {
  if (queued_.empty() && in_flight_.empty()) return;
  if (phase_ == Phase::down) {
    if (!queued_.empty()) start_connect();
    return;
  }
  if (phase_ == Phase::connecting) return;
  if (reset_pending_) return;  // draining before a reset: new queries wait for the new session
  while (!queued_.empty()) {
    std::shared_ptr<Request> request = std::move(queued_.front());
    queued_.pop_front();
    request->state = Request::State::sent;
    in_flight_.push_back(request);
    if (!send(*request)) {
      lost(PQerrorMessage(conn_));
      return;
    }
  }
  flush();
  if (phase_ == Phase::up && !in_flight_.empty()) arm_read();
}

void AsyncConnection::start_connect() {
  phase_ = Phase::connecting;
  doomed_ = false;
  try {
    conn_ = connect_start(options_);
  } catch (...) {
    phase_ = Phase::down;
    auto queued = std::move(queued_);
    queued_.clear();
    for (auto& r : queued)
      finish(*r, std::current_exception(), Result{});
    return;
  }
  if (PQstatus(conn_) == CONNECTION_BAD) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  connect_timer_.expires_after(options_.connect_timeout);
  connect_timer_.async_wait(
      [self = shared_from_this(), generation = generation_](const asio::error_code& ec) {
        if (ec || generation != self->generation_ || self->phase_ != Phase::connecting) return;
        self->connect_failed(connect_timeout_error(self->options_, self->target_, self->conn_));
      });
  connect_step(PGRES_POLLING_WRITING);
}

void AsyncConnection::connect_step(PostgresPollingStatusType status) {
  const int fd = PQsocket(conn_);
  if (fd < 0) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  // The socket can change while connecting (another host or address of the URL).
  if (!socket_ || socket_->native_handle() != fd) {
    if (socket_) {
      (void)socket_->release();
      socket_.reset();
    }
    socket_.emplace(strand_, fd);
  }
  const auto wait = status == PGRES_POLLING_READING ? asio::posix::descriptor_base::wait_read
                                                    : asio::posix::descriptor_base::wait_write;
  socket_->async_wait(
      wait, [self = shared_from_this(), generation = generation_, status](
                const asio::error_code& ec) { self->on_connect_ready(generation, ec, status); });
}

void AsyncConnection::on_connect_ready(std::uint64_t generation, const asio::error_code& ec,
                                       PostgresPollingStatusType) {
  if (generation != generation_ || phase_ != Phase::connecting) return;
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
  connect_timer_.cancel();
  PQsetErrorVerbosity(conn_, PQERRORS_DEFAULT);
  PQsetNoticeReceiver(conn_, &AsyncConnection::on_notice, this);
  if (PQsetnonblocking(conn_, 1) != 0 || PQenterPipelineMode(conn_) != 1) {
    connect_failed(connect_error(PQerrorMessage(conn_), target_));
    return;
  }
  phase_ = Phase::up;
  connects_.fetch_add(1);
  if (!set_timeout_sql_.empty()) {
    // Internal (no completion): first in the pipeline, before any caller's statement.
    auto request = std::make_shared<Request>();
    request->query.sql = set_timeout_sql_;
    request->query.call = "connect";
    queued_.push_front(std::move(request));
  }
  pump();
}

void AsyncConnection::connect_failed(const PostgresError& error) {
  teardown();
  auto queued = std::move(queued_);
  queued_.clear();
  const std::exception_ptr failure = std::make_exception_ptr(error);
  for (auto& r : queued)
    finish(*r, failure, Result{});
}

// ---- the pipeline ---------------------------------------------------------------------------

bool AsyncConnection::send(Request& request) {
  const Query& q = request.query;
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
      request.sent_prepare = true;
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
  if (reading_ || !socket_) return;
  reading_ = true;
  socket_->async_wait(asio::posix::descriptor_base::wait_read,
                      [self = shared_from_this(), generation = generation_](
                          const asio::error_code& ec) { self->on_readable(generation, ec); });
}

void AsyncConnection::arm_write() {
  if (writing_ || !socket_) return;
  writing_ = true;
  socket_->async_wait(asio::posix::descriptor_base::wait_write,
                      [self = shared_from_this(), generation = generation_](
                          const asio::error_code& ec) { self->on_writable(generation, ec); });
}

void AsyncConnection::on_writable(std::uint64_t generation, const asio::error_code& ec) {
  if (generation != generation_) return;
  writing_ = false;
  if (ec) {
    lost(ec.message());
    return;
  }
  flush();
}

void AsyncConnection::on_readable(std::uint64_t generation, const asio::error_code& ec) {
  if (generation != generation_) return;
  reading_ = false;
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
  if (writing_ == false) flush();  // libpq may have more to send once it could read
  if (phase_ != Phase::up) return;
  if (!in_flight_.empty()) {
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
  while (!in_flight_.empty() && PQisBusy(conn_) == 0) {
    PGresult* raw = PQgetResult(conn_);
    if (raw == nullptr) {
      if (++nulls >= 2) break;  // nothing more has arrived
      continue;
    }
    nulls = 0;
    Result result(raw);
    Request& request = *in_flight_.front();
    const ExecStatusType status = PQresultStatus(raw);
    if (status == PGRES_PIPELINE_SYNC) {
      std::shared_ptr<Request> done = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (done->prepare_failed) prepared_.erase(done->query.statement->name);
      if (done->error.get() != nullptr) {
        std::exception_ptr error = std::make_exception_ptr(
            make_error(conn_, done->error.get(), done->query.call, target_, done->query.kind));
        finish(*done, error, Result{});
      } else {
        finish(*done, nullptr, std::move(done->result));
      }
      continue;
    }
    const bool first = request.results_seen++ == 0;
    if (status == PGRES_PIPELINE_ABORTED) continue;
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE ||
        status == PGRES_NONFATAL_ERROR) {
      if (first && request.sent_prepare) request.prepare_failed = true;
      if (request.error.get() == nullptr) request.error = std::move(result);
      continue;
    }
    request.result = std::move(result);
  }
}

void AsyncConnection::lost(std::string_view why) {
  const std::string message = why.empty() ? std::string("the connection was lost")
                                          : std::string(why.substr(0, why.find('\n')));
  auto in_flight = std::move(in_flight_);
  in_flight_.clear();
  teardown();
  reset_pending_ = false;
  for (auto& r : in_flight)
    finish(*r, lost_error(r->query, target_, message), Result{});
  pump();  // queries not sent yet go to a new session
}

void AsyncConnection::teardown() noexcept {
  ++generation_;
  reading_ = false;
  writing_ = false;
  phase_ = Phase::down;
  connect_timer_.cancel();
  prepared_.clear();
  if (socket_) {
    // libpq owns the descriptor: take it back from Asio before PQfinish closes it.
    (void)socket_->release();
    socket_.reset();
  }
  if (conn_ != nullptr) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
}

bool AsyncConnection::idle_connection_healthy() {
  if (doomed_ || PQstatus(conn_) != CONNECTION_OK) return false;
  for (int round = 0; round < 4; ++round) {
    pollfd fd{PQsocket(conn_), POLLIN, 0};
    const int ready = ::poll(&fd, 1, 0);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return false;
    if (ready == 0) return true;
    if (PQconsumeInput(conn_) == 0) return false;
    (void)PQisBusy(conn_);
    while (PGnotify* stray = PQnotifies(conn_))
      PQfreemem(stray);
    if (doomed_ || PQstatus(conn_) != CONNECTION_OK) return false;
  }
  return false;
}

void AsyncConnection::on_notice(void* self, const PGresult* notice) {
  const char* severity = PQresultErrorField(notice, PG_DIAG_SEVERITY_NONLOCALIZED);
  if (severity != nullptr &&
      (std::strcmp(severity, "FATAL") == 0 || std::strcmp(severity, "PANIC") == 0)) {
    static_cast<AsyncConnection*>(self)->doomed_ = true;
  }
}

}  // namespace idem::postgres::detail
