#include "idem/postgres/async_postgres.hpp"

#include <libpq-fe.h>

#include <asio/bind_executor.hpp>
#include <asio/use_awaitable.hpp>
#include <charconv>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "async_connection.hpp"
#include "async_pool.hpp"
#include "claim_logic.hpp"
#include "connection.hpp"
#include "idem/error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "pool_access.hpp"
#include "record_decoder.hpp"
#include "sql_text.hpp"
#include "steps.hpp"

namespace idem::postgres {

namespace {

using detail::Params;
using detail::Query;
using detail::Result;
using detail::Statement;

using detail::check_fingerprint;
using detail::fits_token;
using detail::require_utf8_marker;

// The coroutine classes use the blocking ones' tables: constructing the blocking class (on the
// pool's blocking side) creates or migrates them (a store's listener thread starts only on
// wait(), which this never calls); its connections are then let go, as the coroutine face
// talks through its own.
template <typename Blocking>
std::shared_ptr<AsyncConnectionPool> with_tables(std::shared_ptr<AsyncConnectionPool> pool,
                                                 const char* who) {
  if (!pool) throw InvalidArgument(std::string(who) + " needs a connection pool (got null)");
  { Blocking tables(pool->blocking_pool()); }
  pool->blocking_pool()->drop_idle();
  return pool;
}

// As in the blocking recorder.
constexpr std::size_t kBatchChunk = 1000;

// The coroutine face's runner of a step (steps.hpp) on `connection`.
async::Task<Result> run_step(detail::AsyncConnection& connection, const detail::Step& step,
                             std::string_view call) {
  const Query query{step.statement, step.sql, &step.params, call, step.kind};
  co_return co_await connection.run(query, asio::use_awaitable);
}

// One statement on a pipelined connection of the pool.
async::Task<Result> run_shared(detail::AsyncPool& pool, const Statement& statement,
                               const Params& params, std::string_view call, StatementKind kind) {
  std::shared_ptr<detail::AsyncConnection> connection = co_await pool.shared(call);
  const Query query{&statement, {}, &params, call, kind};
  co_return co_await connection->run(query, asio::use_awaitable);
}

// One step on a pipelined connection of the pool.
async::Task<Result> run_shared(detail::AsyncPool& pool, const detail::Step& step,
                               std::string_view call) {
  std::shared_ptr<detail::AsyncConnection> connection = co_await pool.shared(call);
  co_return co_await run_step(*connection, step, call);
}

// A step's yes or no.
async::Task<bool> answer_shared(detail::AsyncPool& pool, const detail::Step& step,
                                std::string_view call) {
  const Result result = co_await run_shared(pool, step, call);
  co_return step.answer(result);
}

}  // namespace

// ---- AsyncConnectionPool --------------------------------------------------------------------

AsyncConnectionPool::AsyncConnectionPool(asio::any_io_executor executor, PostgresOptions options)
    : blocking_(std::make_shared<ConnectionPool>(std::move(options))),
      core_(std::make_shared<detail::AsyncPool>(std::move(executor), blocking_->options(),
                                                blocking_->target())) {}

AsyncConnectionPool::~AsyncConnectionPool() = default;

AsyncConnectionPool::executor_type AsyncConnectionPool::get_executor() const noexcept {
  return core_->executor();
}

const PostgresOptions& AsyncConnectionPool::options() const noexcept {
  return blocking_->options();
}

const std::string& AsyncConnectionPool::target() const noexcept {
  return blocking_->target();
}

AsyncPoolStats AsyncConnectionPool::stats() const {
  return core_->stats();
}

// ---- the transaction handle -----------------------------------------------------------------

namespace {

class AsyncPostgresTransaction final : public async::AsyncSqlTransaction {
 public:
  AsyncPostgresTransaction(detail::AsyncConnection& connection, std::string_view consumer,
                           std::string_view event_id) noexcept
      : AsyncSqlTransaction(consumer, event_id), connection_(connection) {}

 private:
  async::Task<std::int64_t> do_exec(std::string_view sql,
                                    std::span<const SqlParam> params) override {
    const Result result = co_await run(sql, params);
    co_return result.changed_or_returned();
  }

  async::Task<std::int64_t> do_query_int64(std::string_view sql,
                                           std::span<const SqlParam> params) override {
    const Result result = co_await run(sql, params);
    if (result.rows() == 0 || PQnfields(result.get()) == 0 || result.is_null(0, 0)) {
      throw StoreError("AsyncSqlTransaction::query_int64: the statement returned no value");
    }
    const std::string_view text = result.bytes(0, 0);
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw StoreError("AsyncSqlTransaction::query_int64: the value '" +
                       std::string(text.substr(0, 32)) + "' is not an integer");
    }
    co_return value;
  }

  async::Task<std::optional<std::string>> do_query_text(std::string_view sql,
                                                        std::span<const SqlParam> params) override {
    const Result result = co_await run(sql, params);
    if (result.rows() == 0 || PQnfields(result.get()) == 0 || result.is_null(0, 0)) {
      co_return std::nullopt;
    }
    co_return std::string(result.bytes(0, 0));
  }

  async::Task<Result> run(std::string_view sql, std::span<const SqlParam> params) {
    const Params converted = detail::to_params(params);
    const Query query{nullptr, sql, &converted, "AsyncSqlTransaction", StatementKind::read};
    co_return co_await connection_.run(query, asio::use_awaitable);
  }

  detail::AsyncConnection& connection_;
};

const Query kRollback{nullptr, "ROLLBACK", nullptr, "AsyncPostgresRecorder::run_transactional",
                      StatementKind::read};

// Rolls back off the caller's path (the caller may be cancelled) and gives the connection back
// to the pool when the server answered; a connection that could not roll back is closed.
void rollback_detached(detail::AsyncPool& pool, detail::AsyncPool::Exclusive lease) {
  auto held = std::make_shared<detail::AsyncPool::Exclusive>(std::move(lease));
  detail::AsyncConnection& connection = held->connection();
  connection.run(kRollback, asio::bind_executor(
                                pool.executor(), [held](std::exception_ptr error, Result result) {
                                  if (error || result.get() == nullptr ||
                                      std::string_view(PQcmdStatus(result.get())) != "ROLLBACK") {
                                    held->mark_broken();
                                  }
                                }));
}

}  // namespace

// ---- AsyncPostgresRecorder ------------------------------------------------------------------

class AsyncPostgresRecorder::Impl : public detail::RecorderSql {
 public:
  explicit Impl(std::shared_ptr<AsyncConnectionPool> shared_pool)
      : RecorderSql(shared_pool->options()),
        pool(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()) {}

  async::Task<Result> run(const Statement& statement, const Params& params, std::string_view call,
                          StatementKind kind) {
    co_return co_await run_shared(detail::PoolAccess::core(*pool), statement, params, call, kind);
  }

  std::shared_ptr<AsyncConnectionPool> pool;
  std::shared_ptr<Clock> clock;
};

AsyncPostgresRecorder::AsyncPostgresRecorder(asio::any_io_executor executor,
                                             PostgresOptions options)
    : AsyncPostgresRecorder(
          std::make_shared<AsyncConnectionPool>(std::move(executor), std::move(options))) {}

AsyncPostgresRecorder::AsyncPostgresRecorder(std::shared_ptr<AsyncConnectionPool> pool)
    : impl_(std::make_unique<Impl>(
          with_tables<PostgresIdempotencyRecorder>(std::move(pool), "AsyncPostgresRecorder"))) {
  static_assert(kSchemaVersion == PostgresIdempotencyRecorder::kSchemaVersion);
}

AsyncPostgresRecorder::~AsyncPostgresRecorder() = default;

const std::shared_ptr<AsyncConnectionPool>& AsyncPostgresRecorder::pool() const noexcept {
  return impl_->pool;
}

async::Task<bool> AsyncPostgresRecorder::do_is_processed(std::string_view consumer,
                                                         std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  const detail::Step step = detail::recorder_is_processed(*impl_, consumer, event_id);
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresRecorder::is_processed");
}

async::Task<void> AsyncPostgresRecorder::do_mark_processed(std::string_view consumer,
                                                           std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  const detail::Step step =
      detail::recorder_mark(*impl_, consumer, event_id, impl_->clock->wall_now());
  (void)co_await run_shared(detail::PoolAccess::core(*impl_->pool), step,
                            "AsyncPostgresRecorder::mark_processed");
}

async::Task<std::vector<bool>> AsyncPostgresRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  detail::require_utf8_key("consumer", consumer);
  for (const std::string& event_id : event_ids)
    detail::require_utf8_key("event id", event_id);
  std::vector<bool> processed(event_ids.size(), false);
  std::unordered_set<std::string_view> found;
  std::vector<Result> results;  // `found` points into their rows
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const auto chunk = event_ids.subspan(offset, std::min(kBatchChunk, event_ids.size() - offset));
    Params params;
    params.text(consumer).text_array(chunk);
    results.push_back(co_await impl_->run(impl_->select_markers_many, params,
                                          "AsyncPostgresRecorder::is_processed_many",
                                          StatementKind::read));
    const Result& result = results.back();
    for (int row = 0; row < result.rows(); ++row)
      found.insert(result.bytes(row, 0));
  }
  for (std::size_t i = 0; i < event_ids.size(); ++i)
    processed[i] = found.contains(event_ids[i]);
  co_return processed;
}

async::Task<void> AsyncPostgresRecorder::do_mark_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  detail::require_utf8_key("consumer", consumer);
  for (const std::string& event_id : event_ids)
    detail::require_utf8_key("event id", event_id);
  const WallTime now = impl_->clock->wall_now();
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const auto chunk = event_ids.subspan(offset, std::min(kBatchChunk, event_ids.size() - offset));
    Params params;
    params.text(consumer).text_array(chunk).timestamptz(now);
    (void)co_await impl_->run(impl_->insert_markers_many, params,
                              "AsyncPostgresRecorder::mark_processed_many", StatementKind::write);
  }
}

async::Task<Claim> AsyncPostgresRecorder::do_claim(std::string_view consumer,
                                                   std::string_view event_id, Millis lease) {
  require_utf8_marker(consumer, event_id);
  constexpr std::string_view kCall = "AsyncPostgresRecorder::claim";
  detail::RecorderClaim claim(*impl_, *impl_->clock, consumer, event_id, lease, kCall,
                              impl_->pool->target());
  for (;;) {
    const Result result =
        co_await run_shared(detail::PoolAccess::core(*impl_->pool), claim.step(), kCall);
    if (claim.read(result)) break;
  }
  co_return claim.outcome();
}

async::Task<bool> AsyncPostgresRecorder::do_complete(std::string_view consumer,
                                                     std::string_view event_id,
                                                     std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  const detail::Step step =
      detail::recorder_complete(*impl_, consumer, event_id, token, impl_->clock->wall_now());
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresRecorder::complete");
}

async::Task<bool> AsyncPostgresRecorder::do_release(std::string_view consumer,
                                                    std::string_view event_id,
                                                    std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  const detail::Step step = detail::recorder_release(*impl_, consumer, event_id, token);
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresRecorder::release");
}

async::Task<bool> AsyncPostgresRecorder::do_renew(std::string_view consumer,
                                                  std::string_view event_id, std::uint64_t token,
                                                  Millis lease) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  const detail::Step step = detail::recorder_renew(
      *impl_, consumer, event_id, token, detail::add_saturating(impl_->clock->wall_now(), lease));
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresRecorder::renew");
}

async::Task<bool> AsyncPostgresRecorder::do_run_transactional(std::string_view consumer,
                                                              std::string_view event_id,
                                                              TransactionalFn fn) {
  require_utf8_marker(consumer, event_id);
  constexpr std::string_view kCall = "AsyncPostgresRecorder::run_transactional";
  detail::AsyncPool& pool = detail::PoolAccess::core(*impl_->pool);
  detail::AsyncPool::Exclusive lease = co_await pool.exclusive(kCall);
  detail::AsyncConnection& connection = lease.connection();
  detail::TransactionalMark mark(*impl_, consumer, event_id, impl_->clock->wall_now(), kCall,
                                 impl_->pool->target());
  std::exception_ptr failure;
  try {
    for (bool more = true; more;) {
      switch (mark.action()) {
        case detail::TransactionalMark::Action::send: {
          const Result result = co_await run_step(connection, mark.step(), kCall);
          mark.read(result);
          break;
        }
        case detail::TransactionalMark::Action::run_handler: {
          AsyncPostgresTransaction handle(connection, consumer, event_id);
          co_await fn(handle);
          mark.handler_ran(connection.transaction_status());
          break;
        }
        case detail::TransactionalMark::Action::done:
          more = false;
          break;
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (mark.broken()) {
    lease.mark_broken();  // its state is unknown: closed, so the server rolls back
  } else if (mark.in_transaction()) {
    rollback_detached(pool, std::move(lease));  // off the caller's path: it may be cancelled
  }
  if (failure) std::rethrow_exception(failure);
  co_return mark.ran();
}

// ---- AsyncPostgresStore ---------------------------------------------------------------------

class AsyncPostgresStore::Impl : public detail::StoreSql {
 public:
  explicit Impl(std::shared_ptr<AsyncConnectionPool> shared_pool)
      : StoreSql(shared_pool->options()),
        pool(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()) {}

  std::shared_ptr<AsyncConnectionPool> pool;
  std::shared_ptr<Clock> clock;
};

AsyncPostgresStore::AsyncPostgresStore(asio::any_io_executor executor, PostgresOptions options)
    : AsyncPostgresStore(
          std::make_shared<AsyncConnectionPool>(std::move(executor), std::move(options))) {}

AsyncPostgresStore::AsyncPostgresStore(std::shared_ptr<AsyncConnectionPool> pool)
    : impl_(std::make_unique<Impl>(
          with_tables<PostgresIdempotencyStore>(std::move(pool), "AsyncPostgresStore"))) {
  static_assert(kSchemaVersion == PostgresIdempotencyStore::kSchemaVersion);
  // wait() polls lookup(): whether a lease still holds, and when the deadline has passed, are
  // decided on the store's clock (PostgresOptions::clock), as every other call's answer is.
  wait_clock_ = impl_->clock;
}

AsyncPostgresStore::~AsyncPostgresStore() = default;

const std::shared_ptr<AsyncConnectionPool>& AsyncPostgresStore::pool() const noexcept {
  return impl_->pool;
}

async::Task<ClaimOutcome> AsyncPostgresStore::do_claim(std::string_view key,
                                                       std::optional<std::string_view> fingerprint,
                                                       Millis lease) {
  detail::require_utf8_key("idempotency key", key);
  check_fingerprint(fingerprint);
  constexpr std::string_view kCall = "AsyncPostgresStore::claim";
  detail::StoreClaim claim(*impl_, *impl_->clock, key, fingerprint, lease, kCall,
                           impl_->pool->target());
  for (;;) {
    const Result result =
        co_await run_shared(detail::PoolAccess::core(*impl_->pool), claim.step(), kCall);
    if (claim.read(result)) break;
  }
  co_return std::move(claim.outcome());
}

async::Task<bool> AsyncPostgresStore::do_complete(std::string_view key, std::uint64_t token,
                                                  StoredValue value, const ExecutionReport& report,
                                                  Millis ttl) {
  detail::require_utf8_key("idempotency key", key);
  if (!value.bytes) {
    throw InvalidArgument(
        "AsyncPostgresStore keeps values as bytes: StoredValue::bytes must be set (the "
        "coordinator encodes results with idem::Codec<T>)");
  }
  if (!fits_token(token)) co_return false;
  const detail::Step step = detail::store_complete(*impl_, key, token, *value.bytes, report,
                                                   impl_->clock->wall_now(), ttl);
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresStore::complete");
}

async::Task<bool> AsyncPostgresStore::do_release(std::string_view key, std::uint64_t token) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) co_return false;
  const detail::Step step = detail::store_release(*impl_, key, token);
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresStore::release");
}

async::Task<bool> AsyncPostgresStore::do_renew(std::string_view key, std::uint64_t token,
                                               Millis lease) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) co_return false;
  const detail::Step step = detail::store_renew(
      *impl_, key, token, detail::add_saturating(impl_->clock->wall_now(), lease));
  co_return co_await answer_shared(detail::PoolAccess::core(*impl_->pool), step,
                                   "AsyncPostgresStore::renew");
}

async::Task<std::optional<IdempotencyRecord>> AsyncPostgresStore::do_lookup(std::string_view key) {
  detail::require_utf8_key("idempotency key", key);
  const detail::Step step = detail::store_lookup(*impl_, key);
  const Result result = co_await run_shared(detail::PoolAccess::core(*impl_->pool), step,
                                            "AsyncPostgresStore::lookup");
  co_return detail::store_lookup_answer(*impl_, key, result, impl_->clock->wall_now());
}

}  // namespace idem::postgres
