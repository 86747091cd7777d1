// Internal: one non-blocking libpq connection in pipeline mode, driven by Asio, and the query
// a coroutine sends through it. Not installed.
//
// The PostgreSQL protocol over idem's pipelined-connection engine
// (idem/async/detail/pipeline.hpp), which owns the calls (queue, in flight, cancellation by id,
// failing them all), the strand, the socket's waits and the ends (the owner's shut_down(), the
// execution context's shutdown). This keeps libpq's side: connecting with PQconnectPoll, sending
// each query as [Parse] Bind/Execute + Sync, so independent statements of many coroutines travel
// in one pipeline (one write, results read in order) and each commits on its own (the Sync ends
// its implicit transaction), reading the results, and what a failure means for each query. A
// caller resumes on its own executor (the completion is handed there: pipeline.hpp).
//
// Cancellation (the caller's cancellation slot; Asio's types): a query not yet sent is withdrawn
// and ends with operation_aborted, whatever the type; a query already sent stays in the pipeline
// — its result is read and dropped so the connection stays in step — and the caller gets
// operation_aborted for a read at once; a write or COMMIT ends at once only for a terminal or
// partial cancellation, with a PostgresError in doubt (a total one, which allows no side
// effects, leaves it to end with its real outcome). No PQcancel: in a pipeline it would cancel
// whichever statement the server runs at that moment, maybe another caller's;
// statement_timeout bounds how long a dropped statement keeps the connection.
//
// A lost connection fails every sent query with the blocking backend's classification
// (postgres_error.cpp: writes and COMMIT in doubt) and reconnects for the queries not sent yet;
// a failed connection attempt fails those with the connect error (retryable when the server is
// unreachable).
//
// Thread-safety: run(), load(), shut_down(), reset() and transaction_status() from any thread;
// the rest is internal to the strand.
#pragma once

#include <libpq-fe.h>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>

#include "connection.hpp"
#include "idem/async/detail/pipeline.hpp"
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

// One query on the connection, and what reading its results collects.
struct PgCall {
  explicit PgCall(const Query& q) : query(q) {}
  Query query;
  bool sent_prepare = false;
  int results_seen = 0;
  bool prepare_failed = false;
  Result result;
  Result error;
};

class AsyncConnection : public async::detail::Pipeline<AsyncConnection, PgCall, Result> {
 public:
  AsyncConnection(asio::any_io_executor executor, const PostgresOptions& options,
                  std::string target);
  ~AsyncConnection();

  // Runs `query`; completes with its Result (binary for a Statement, text for SQL text) or the
  // PostgresError. `query` must stay valid until the completion.
  template <class Token>
  auto run(const Query& query, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, Result)>(
        [self = shared_from_this(), &query](auto handler) {
          self->start(std::move(handler), PgCall(query));
        },
        token);
  }

  // Held by one coroutine for a transaction: the pool hands it to nobody else meanwhile.
  bool exclusive = false;  // guarded by the pool's mutex
  // Closes the connection after what is in the pipeline (used when a transaction left it in an
  // unknown state): the next query reconnects.
  void reset();
  // The session's transaction status as of the last query's end (PQtransactionStatus once its
  // Sync was read): meaningful to the one coroutine that holds the connection for a transaction.
  PGTransactionStatusType transaction_status() const noexcept { return transaction_status_.load(); }

  // Counters for tests and the benchmark.
  std::uint64_t connects() const noexcept { return connects_.load(); }

  // ---- the engine's hooks (on the strand) ----
  void pump();
  std::exception_ptr cancel_sent(const PgCall& call, asio::cancellation_type type) const;
  void close_transport() noexcept;

 private:
  void start_connect();
  void connect_step(PostgresPollingStatusType status);
  void on_connect_ready(const asio::error_code& ec);
  void connected();
  void connect_failed(const PostgresError& error);
  bool send(PgCall& call);
  void flush();
  void arm_read();
  void arm_write();
  void on_readable(const asio::error_code& ec);
  void drain();
  void lost(std::string_view why);
  void teardown() noexcept;
  bool idle_connection_healthy();
  static void on_notice(void* self, const PGresult* notice);

  enum class Phase { down, connecting, up };

  const PostgresOptions options_;
  std::string target_;
  PGconn* conn_ = nullptr;
  Phase phase_ = Phase::down;
  bool doomed_ = false;  // a FATAL arrived, or a write was refused as read-only (25006)
  bool reset_pending_ = false;
  std::unordered_set<std::string> prepared_;
  std::string set_timeout_sql_;
  std::atomic<PGTransactionStatusType> transaction_status_{PQTRANS_IDLE};
  std::atomic<std::uint64_t> connects_{0};
};

}  // namespace idem::postgres::detail
