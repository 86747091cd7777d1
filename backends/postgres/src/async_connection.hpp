// Internal: one non-blocking libpq connection in pipeline mode, driven by Asio, and the query
// a coroutine sends through it. Not installed.
//
// An AsyncConnection belongs to a strand of the pool's executor; everything that touches the
// PGconn runs there. Coroutines on any executor submit queries; each query is sent as
// [Parse] Bind/Execute + Sync, so independent statements of many coroutines travel in one
// pipeline (one write, results read in order) and each commits on its own (the Sync ends its
// implicit transaction). A caller resumes on its own executor (the completion is posted there).
//
// Cancellation (the caller's cancellation slot): a query not yet sent is withdrawn and ends with
// operation_aborted; a query already sent stays in the pipeline — its result is read and dropped
// so the connection stays in step — and the caller gets operation_aborted for a read, a
// PostgresError in doubt for a write or COMMIT. No PQcancel: in a pipeline it would cancel
// whichever statement the server runs at that moment, maybe another caller's;
// statement_timeout bounds how long a dropped statement keeps the connection.
//
// A lost connection fails every sent query with the blocking backend's classification
// (postgres_error.cpp: writes and COMMIT in doubt) and reconnects for the queries not sent yet;
// a failed connection attempt fails those with the connect error (retryable when the server is
// unreachable).
//
// Thread-safety: submit() from any thread; the rest is internal to the strand.
#pragma once

#include <libpq-fe.h>

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

#include "connection.hpp"
#include "idem/async/detail/shutdown_registry.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres::detail {

// What a coroutine asks for. It lives in the awaiting coroutine's frame, which stays until the
// completion: the connection reads it (and the parameters it references) only before then.
struct Query {
  const Statement* statement = nullptr;  // idem's own statement (binary results), or
  std::string_view sql;                  // SQL text (text results) when statement is null
  const Params* params = nullptr;        // may be null: no parameters
  std::string_view call;                 // for messages ("AsyncPostgresRecorder::claim")
  StatementKind kind = StatementKind::read;
};

class AsyncConnection;

// The type-erased completion of one query (Asio 1.22 has no any_completion_handler).
class Completion {
 public:
  virtual ~Completion() = default;
  // Posts the handler to its own executor with the outcome. Called once.
  virtual void complete(std::exception_ptr error, Result result) = 0;
};

// One submitted query, owned by the connection while queued or in the pipeline.
struct Request {
  enum class State { queued, sent, done };
  Query query;
  std::unique_ptr<Completion> completion;  // null once completed (or for internal queries)
  State state = State::queued;
  bool sent_prepare = false;
  int results_seen = 0;
  bool prepare_failed = false;
  Result result;
  Result error;
};

class AsyncConnection : public std::enable_shared_from_this<AsyncConnection> {
 public:
  AsyncConnection(asio::any_io_executor executor, const PostgresOptions& options,
                  std::string target);
  ~AsyncConnection();

  AsyncConnection(const AsyncConnection&) = delete;
  AsyncConnection& operator=(const AsyncConnection&) = delete;

  // Runs `query`; completes with its Result (binary for a Statement, text for SQL text) or the
  // PostgresError. `query` must stay valid until the completion.
  template <class Token>
  auto run(const Query& query, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, Result)>(
        [self = shared_from_this(), &query](auto handler) {
          self->start(query, std::move(handler));
        },
        token);
  }

  // Queries submitted and not completed yet (queued or in the pipeline), for the pool's choice.
  std::size_t load() const noexcept { return load_.load(std::memory_order_relaxed); }
  // Held by one coroutine for a transaction: the pool hands it to nobody else meanwhile.
  bool exclusive = false;  // guarded by the pool's mutex
  // Closes the connection after what is in the pipeline (used when a transaction left it in an
  // unknown state): the next query reconnects.
  void reset();
  // Closes now: every pending query fails with operation_aborted. For the pool's destructor.
  void shut_down();
  // The executor's execution context is shutting down (its destructor, nothing runs it any
  // more): the queries still queued or in the pipeline are destroyed without being completed,
  // as Asio destroys every operation pending on a context that goes, and the session is closed.
  // Their handlers may own this connection (a coroutine frame holding the pool's lease), so
  // keeping them would keep the connection, and everything the frames own, forever.
  void abandon() noexcept;

  // Counters for tests and the benchmark.
  std::uint64_t connects() const noexcept { return connects_.load(); }

 private:
  template <class Handler>
  class CompletionFor;

  template <class Handler>
  void start(const Query& query, Handler handler);
  void submit(std::shared_ptr<Request> request);
  void cancel(const std::shared_ptr<Request>& request);
  void finish(Request& request, std::exception_ptr error, Result result);

  void pump();
  void start_connect();
  void connect_step(PostgresPollingStatusType status);
  void on_connect_ready(std::uint64_t generation, const asio::error_code& ec,
                        PostgresPollingStatusType status);
  void connected();
  void connect_failed(const PostgresError& error);
  bool send(Request& request);
  void flush();
  void arm_read();
  void arm_write();
  void on_readable(std::uint64_t generation, const asio::error_code& ec);
  void on_writable(std::uint64_t generation, const asio::error_code& ec);
  void drain();
  void lost(std::string_view why);
  void teardown() noexcept;
  bool idle_connection_healthy();
  static void on_notice(void* self, const PGresult* notice);

  enum class Phase { down, connecting, up };

  asio::strand<asio::any_io_executor> strand_;
  // Of strand_'s execution context: calls abandon() when it shuts down.
  async::detail::ShutdownRegistry<AsyncConnection>& registry_;
  const PostgresOptions options_;
  std::string target_;
  PGconn* conn_ = nullptr;
  std::optional<asio::posix::stream_descriptor> socket_;
  asio::steady_timer connect_timer_;
  Phase phase_ = Phase::down;
  bool doomed_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool reset_pending_ = false;
  bool pump_scheduled_ = false;
  std::uint64_t generation_ = 0;  // bumped by teardown: stale handlers see a new value
  std::deque<std::shared_ptr<Request>> queued_;
  std::deque<std::shared_ptr<Request>> in_flight_;
  std::unordered_set<std::string> prepared_;
  std::string set_timeout_sql_;
  std::atomic<std::size_t> load_{0};
  std::atomic<std::uint64_t> connects_{0};
};

// ---- templates ------------------------------------------------------------------------------

template <class Handler>
class AsyncConnection::CompletionFor final : public Completion {
 public:
  explicit CompletionFor(Handler handler)
      : handler_(std::move(handler)),
        work_(asio::get_associated_executor(handler_)),
        slot_(asio::get_associated_cancellation_slot(handler_)) {}

  asio::cancellation_slot slot() const noexcept { return slot_; }

  void complete(std::exception_ptr error, Result result) override {
    auto executor = work_.get_executor();
    asio::post(executor, [handler = std::move(handler_), work = std::move(work_), slot = slot_,
                          error = std::move(error), result = std::move(result)]() mutable {
      if (slot.is_connected()) slot.clear();
      std::move(handler)(std::move(error), std::move(result));
    });
  }

 private:
  Handler handler_;
  asio::executor_work_guard<asio::associated_executor_t<Handler>> work_;
  asio::cancellation_slot slot_;
};

template <class Handler>
void AsyncConnection::start(const Query& query, Handler handler) {
  auto request = std::make_shared<Request>();
  request->query = query;
  auto completion = std::make_unique<CompletionFor<Handler>>(std::move(handler));
  asio::cancellation_slot slot = completion->slot();
  request->completion = std::move(completion);
  load_.fetch_add(1, std::memory_order_relaxed);
  if (slot.is_connected()) {
    // Runs where the cancellation is emitted; the request is only touched on the strand.
    slot.assign([weak_self = weak_from_this(),
                 weak_request = std::weak_ptr<Request>(request)](asio::cancellation_type) {
      auto self = weak_self.lock();
      if (!self) return;
      asio::post(self->strand_, [self, weak_request] {
        if (auto r = weak_request.lock()) self->cancel(r);
      });
    });
  }
  asio::post(strand_, [self = shared_from_this(), request = std::move(request)]() mutable {
    self->submit(std::move(request));
  });
}

}  // namespace idem::postgres::detail
