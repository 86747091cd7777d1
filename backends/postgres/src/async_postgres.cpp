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
#include "record_decoder.hpp"
#include "sql_text.hpp"

namespace idem::postgres {

namespace {

using detail::kTextOid;
using detail::Params;
using detail::Query;
using detail::Result;
using detail::Statement;
using State = IdempotencyRecord::State;

using detail::check_fingerprint;
using detail::fits_token;
using detail::is_live;
using detail::kClaimRounds;
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

async::Task<Result> run_on(detail::AsyncConnection& connection, const Query& query) {
  co_return co_await connection.run(query, asio::use_awaitable);
}

// One statement on a pipelined connection of the pool.
async::Task<Result> run_shared(detail::AsyncPool& pool, const Statement& statement,
                               const Params& params, std::string_view call, StatementKind kind) {
  std::shared_ptr<detail::AsyncConnection> connection = co_await pool.shared(call);
  const Query query{&statement, {}, &params, call, kind};
  co_return co_await connection->run(query, asio::use_awaitable);
}

}  // namespace

// ---- AsyncConnectionPool --------------------------------------------------------------------

AsyncConnectionPool::AsyncConnectionPool(asio::any_io_executor executor, PostgresOptions options)
    : blocking_(std::make_shared<ConnectionPool>(std::move(options))),
      core_(std::make_shared<detail::AsyncPool>(std::move(executor), blocking_->options(),
                                                blocking_->target())) {}

AsyncConnectionPool::~AsyncConnectionPool() = default;

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
      : connection_(connection), consumer_(consumer), event_id_(event_id) {}

  std::string_view consumer() const noexcept override { return consumer_; }
  std::string_view event_id() const noexcept override { return event_id_; }

  async::Task<void> exec(std::string_view sql, std::span<const SqlParam> params) override {
    (void)co_await run(sql, params);
  }

  async::Task<std::int64_t> query_int64(std::string_view sql,
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

  async::Task<std::optional<std::string>> query_text(std::string_view sql,
                                                     std::span<const SqlParam> params) override {
    const Result result = co_await run(sql, params);
    if (result.rows() == 0 || PQnfields(result.get()) == 0 || result.is_null(0, 0)) {
      co_return std::nullopt;
    }
    co_return std::string(result.bytes(0, 0));
  }

  bool failed() const noexcept { return failed_; }

 private:
  async::Task<Result> run(std::string_view sql, std::span<const SqlParam> params) {
    const Params converted = detail::to_params(params);
    const Query query{nullptr, sql, &converted, "AsyncSqlTransaction", StatementKind::read};
    try {
      co_return co_await connection_.run(query, asio::use_awaitable);
    } catch (const PostgresError&) {
      failed_ = true;  // the transaction is aborted now: COMMIT will answer ROLLBACK
      throw;
    }
  }

  detail::AsyncConnection& connection_;
  std::string_view consumer_;
  std::string_view event_id_;
  bool failed_ = false;
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
    co_return co_await run_shared(pool->core(), statement, params, call, kind);
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
  Params params;
  params.text(consumer).text(event_id);
  const Result result = co_await impl_->run(
      impl_->select_marker, params, "AsyncPostgresRecorder::is_processed", StatementKind::read);
  co_return result.rows() > 0;
}

async::Task<void> AsyncPostgresRecorder::do_mark_processed(std::string_view consumer,
                                                           std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  Params params;
  params.text(consumer).text(event_id).timestamptz(impl_->clock->wall_now());
  (void)co_await impl_->run(impl_->insert_marker, params, "AsyncPostgresRecorder::mark_processed",
                            StatementKind::write);
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
  for (int round = 0; round < kClaimRounds; ++round) {
    const WallTime now = impl_->clock->wall_now();
    const WallTime lease_until = detail::add_saturating(now, lease);
    Params params;
    params.text(consumer).text(event_id).timestamptz(now).timestamptz(lease_until);
    const Result result = co_await impl_->run(impl_->claim, params, kCall, StatementKind::write);
    if (auto decided = detail::recorder_claim_decision(result, now)) co_return *decided;
    // Another writer got there first: look again with a fresh snapshot.
    Params key;
    key.text(consumer).text(event_id);
    const Result again = co_await impl_->run(impl_->reread, key, kCall, StatementKind::read);
    if (auto decided = detail::recorder_reread_decision(again, now)) co_return *decided;
    // Released (or its lease passed) in between: claim again.
  }
  detail::throw_recorder_claim_busy(kCall, impl_->pool->target(), consumer, event_id);
}

async::Task<bool> AsyncPostgresRecorder::do_complete(std::string_view consumer,
                                                     std::string_view event_id,
                                                     std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  Params params;
  params.text(consumer)
      .text(event_id)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(impl_->clock->wall_now());
  const Result result = co_await impl_->run(
      impl_->complete, params, "AsyncPostgresRecorder::complete", StatementKind::write);
  co_return result.int8(0, 0) > 0;
}

async::Task<bool> AsyncPostgresRecorder::do_release(std::string_view consumer,
                                                    std::string_view event_id,
                                                    std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  Params params;
  params.text(consumer).text(event_id).int8(static_cast<std::int64_t>(token));
  const Result result = co_await impl_->run(impl_->release, params,
                                            "AsyncPostgresRecorder::release", StatementKind::write);
  co_return result.affected() > 0;
}

async::Task<bool> AsyncPostgresRecorder::do_renew(std::string_view consumer,
                                                  std::string_view event_id, std::uint64_t token,
                                                  Millis lease) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) co_return false;
  Params params;
  params.text(consumer)
      .text(event_id)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(detail::add_saturating(impl_->clock->wall_now(), lease));
  const Result result = co_await impl_->run(impl_->renew, params, "AsyncPostgresRecorder::renew",
                                            StatementKind::write);
  co_return result.affected() > 0;
}

async::Task<bool> AsyncPostgresRecorder::do_run_transactional(std::string_view consumer,
                                                              std::string_view event_id,
                                                              TransactionalFn fn) {
  require_utf8_marker(consumer, event_id);
  constexpr std::string_view kCall = "AsyncPostgresRecorder::run_transactional";
  detail::AsyncPool& pool = impl_->pool->core();
  detail::AsyncPool::Exclusive lease = co_await pool.exclusive(kCall);
  detail::AsyncConnection& connection = lease.connection();
  const std::string target = impl_->pool->target();

  // Until COMMIT is sent, any way out rolls back (off the caller's path: it may be cancelled).
  bool in_transaction = false;
  bool outcome = false;
  std::exception_ptr failure;
  try {
    static const Query begin{nullptr, "BEGIN", nullptr, kCall, StatementKind::read};
    in_transaction = true;  // from here on, a ROLLBACK is harmless at worst
    (void)co_await run_on(connection, begin);
    Params params;
    params.text(consumer).text(event_id).timestamptz(impl_->clock->wall_now());
    const Query mark{&impl_->transactional_mark, {}, &params, kCall, StatementKind::read};
    const Result marked = co_await run_on(connection, mark);
    if (marked.int8(0, 0) == 0) {
      outcome = false;  // already processed: roll back, do not run
    } else if (marked.int8(0, 1) == 0) {
      Params key;
      key.text(consumer).text(event_id);
      const Query reread{&impl_->reread, {}, &key, kCall, StatementKind::read};
      const Result claim = co_await run_on(connection, reread);
      if (claim.is_null(0, 1) || !claim.boolean(0, 2)) {
        throw AlreadyInProgress("(" + std::string(consumer) + ", " + std::string(event_id) +
                                ") is claimed by another delivery whose lease has not passed");
      }
      outcome = false;  // done by a claim
    } else {
      AsyncPostgresTransaction handle(connection, consumer, event_id);
      co_await fn(handle);  // throws → rolled back below
      static const Query commit{nullptr, "COMMIT", nullptr, kCall, StatementKind::commit};
      in_transaction = false;
      Result committed;
      try {
        committed = co_await run_on(connection, commit);
      } catch (...) {
        lease.mark_broken();  // the session's state after a failed COMMIT is not worth keeping
        throw;
      }
      // COMMIT of a transaction the server had already aborted answers ROLLBACK.
      if (std::string_view(PQcmdStatus(committed.get())) != "COMMIT") {
        if (handle.failed()) {
          throw PostgresError(ErrorCode::store_error,
                              std::string(kCall) + " on " + target +
                                  ": a statement of the handler for (" + std::string(consumer) +
                                  ", " + std::string(event_id) +
                                  ") failed and the handler went on; the transaction was rolled "
                                  "back (nothing was marked)",
                              "25P02", /*retryable=*/false, false);
        }
        throw PostgresError(ErrorCode::store_error,
                            std::string(kCall) + " on " + target +
                                ": the server rolled the transaction back at COMMIT",
                            "", /*retryable=*/true, false);
      }
      outcome = true;
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (in_transaction) rollback_detached(pool, std::move(lease));
  if (failure) std::rethrow_exception(failure);
  co_return outcome;
}

// ---- AsyncPostgresStore ---------------------------------------------------------------------

class AsyncPostgresStore::Impl : public detail::StoreSql {
 public:
  explicit Impl(std::shared_ptr<AsyncConnectionPool> shared_pool)
      : StoreSql(shared_pool->options()),
        pool(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()) {}

  async::Task<Result> run(const Statement& statement, const Params& params, std::string_view call,
                          StatementKind kind) {
    co_return co_await run_shared(pool->core(), statement, params, call, kind);
  }

  IdempotencyRecord decode(std::string_view key, const Result& result, int row, int first) const {
    return detail::decode_record(key, table_name, result, row, first);
  }

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
  for (int round = 0; round < kClaimRounds; ++round) {
    const WallTime now = impl_->clock->wall_now();
    const Params params = detail::store_claim_params(key, fingerprint, now, lease);
    const Result result = co_await impl_->run(impl_->claim, params, kCall, StatementKind::write);
    if (auto acquired = detail::store_acquired(result)) co_return *acquired;
    std::optional<IdempotencyRecord> record;
    if (result.rows() > 0) record = impl_->decode(key, result, 0, detail::kClaimLeadingColumns);
    if (!record || !is_live(*record, now)) {
      // Another writer changed the row meanwhile: read it again, fresh.
      Params again;
      again.text(key);
      const Result fresh = co_await impl_->run(impl_->lookup, again, kCall, StatementKind::read);
      record.reset();
      if (fresh.rows() > 0) record = impl_->decode(key, fresh, 0, 0);
      if (!record || !is_live(*record, now)) continue;  // gone or dead again: claim again
    }
    co_return ClaimOutcome::found(std::move(*record), fingerprint);
  }
  detail::throw_store_claim_busy(kCall, impl_->pool->target(), key);
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
  if (ttl == Millis::zero()) {
    Params params;
    params.text(key).int8(static_cast<std::int64_t>(token)).text(impl_->channel);
    const Result dropped = co_await impl_->run(impl_->drop, params, "AsyncPostgresStore::complete",
                                               StatementKind::write);
    co_return dropped.rows() > 0;
  }
  const std::string report_json = report.to_json();
  const WallTime now = impl_->clock->wall_now();
  Params params;
  params.text(key)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(now)
      .timestamptz(detail::add_saturating(now, ttl))
      .bytea(*value.bytes)
      .text(report_json)
      .text(impl_->channel);
  const Result result = co_await impl_->run(impl_->complete, params, "AsyncPostgresStore::complete",
                                            StatementKind::write);
  co_return result.rows() > 0;
}

async::Task<bool> AsyncPostgresStore::do_release(std::string_view key, std::uint64_t token) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) co_return false;
  Params params;
  params.text(key).int8(static_cast<std::int64_t>(token)).text(impl_->channel);
  const Result result =
      co_await impl_->run(impl_->drop, params, "AsyncPostgresStore::release", StatementKind::write);
  co_return result.rows() > 0;
}

async::Task<bool> AsyncPostgresStore::do_renew(std::string_view key, std::uint64_t token,
                                               Millis lease) {
  detail::require_utf8_key("idempotency key", key);
  if (!fits_token(token)) co_return false;
  Params params;
  params.text(key)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(detail::add_saturating(impl_->clock->wall_now(), lease));
  const Result result =
      co_await impl_->run(impl_->renew, params, "AsyncPostgresStore::renew", StatementKind::write);
  co_return result.affected() > 0;
}

async::Task<std::optional<IdempotencyRecord>> AsyncPostgresStore::do_lookup(std::string_view key) {
  detail::require_utf8_key("idempotency key", key);
  Params params;
  params.text(key);
  const Result result =
      co_await impl_->run(impl_->lookup, params, "AsyncPostgresStore::lookup", StatementKind::read);
  if (result.rows() == 0) co_return std::nullopt;
  IdempotencyRecord record = impl_->decode(key, result, 0, 0);
  if (record.state == State::completed && impl_->clock->wall_now() >= record.expires_at) {
    co_return std::nullopt;  // expired: absent, whatever the table still holds
  }
  co_return record;
}

}  // namespace idem::postgres
