#include "idem/postgres/postgres_outbox.hpp"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>

#include "connection.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "pool_access.hpp"
#include "rollback_guard.hpp"
#include "schema.hpp"

namespace idem::postgres {

using detail::kInt8Oid;
using detail::kTextOid;
using detail::Params;
using detail::Result;
using detail::Statement;

namespace {

constexpr std::string_view kColumns =
    "seq, consumer, source_event_id, event_id, event_type, payload, headers, event_ts, "
    "created_at, attempts, last_error";

std::map<std::string, std::string> decode_headers(std::string_view text) {
  try {
    return nlohmann::json::parse(text).get<std::map<std::string, std::string>>();
  } catch (const std::exception&) {
    return {};
  }
}

OutboxRow read_row(const Result& r, int i) {
  OutboxRow row;
  row.seq = r.int8(i, 0);
  row.consumer = r.bytes(i, 1);
  row.source_event_id = r.bytes(i, 2);
  row.event.id = r.bytes(i, 3);
  row.event.type = r.bytes(i, 4);
  row.event.payload = r.bytes(i, 5);
  row.event.headers = decode_headers(r.bytes(i, 6));
  row.event.timestamp = r.timestamptz(i, 7);
  row.created_at = r.timestamptz(i, 8);
  row.attempts = static_cast<int>(r.int4(i, 9));
  if (!r.is_null(i, 10)) row.last_error = r.bytes(i, 10);
  return row;
}

}  // namespace

class PostgresOutbox::Impl {
 public:
  Impl(std::shared_ptr<ConnectionPool> p, PostgresOutboxOptions o)
      : pool(std::move(p)),
        options(std::move(o)),
        table(detail::quote_identifier(pool->options().schema) + "." +
              detail::quote_identifier(options.table)),
        channel(options.table),
        insert("WITH ins AS (INSERT INTO " + table +
               " (consumer, source_event_id, event_id, event_type, payload, headers, event_ts)"
               " VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7::bigint / 1000000.0)) "
               "RETURNING 1) "
               "SELECT pg_notify($8, '') FROM ins"),
        lock_consumers("SELECT consumer FROM (SELECT DISTINCT consumer FROM " + table +
                           " WHERE parked_at IS NULL) AS waiting "
                           "WHERE pg_try_advisory_xact_lock(hashtext($1), hashtext(consumer))",
                       {kTextOid}),
        select_rows("SELECT " + std::string(kColumns) + " FROM " + table +
                        " WHERE parked_at IS NULL AND consumer = ANY($1) ORDER BY seq LIMIT $2 "
                        "FOR UPDATE SKIP LOCKED",
                    {detail::kTextArrayOid, kInt8Oid}, detail::Planning::per_run),
        delete_row("DELETE FROM " + table + " WHERE seq = $1", {kInt8Oid}),
        refuse_row("UPDATE " + table +
                       " SET attempts = attempts + 1, last_error = $2, "
                       "parked_at = CASE WHEN $3 THEN now() END WHERE seq = $1",
                   {kInt8Oid, kTextOid, detail::kBoolOid}),
        stats_query(
            "SELECT count(*) FILTER (WHERE parked_at IS NULL), "
            "count(*) FILTER (WHERE parked_at IS NOT NULL), "
            "(extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS "
            "NULL)) * 1000)::bigint FROM " +
                table,
            {}),
        parked_rows("SELECT " + std::string(kColumns) + " FROM " + table +
                        " WHERE parked_at IS NOT NULL ORDER BY seq LIMIT $1",
                    {kInt8Oid}),
        unpark_rows(
            "UPDATE " + table + " SET parked_at = NULL, attempts = 0 WHERE parked_at IS NOT NULL",
            {}) {
    if (options.table.empty()) throw ConfigError("PostgresOutboxOptions::table must be non-empty");
    const std::vector<std::string> steps = {
        "CREATE TABLE IF NOT EXISTS " + table +
            " (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, consumer text NOT NULL, "
            "source_event_id text NOT NULL, event_id text NOT NULL, event_type text NOT NULL, "
            "payload bytea NOT NULL, headers text NOT NULL, event_ts timestamptz NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now(), attempts integer NOT NULL DEFAULT 0, "
            "last_error text, parked_at timestamptz); "
            "CREATE INDEX IF NOT EXISTS " +
            detail::quote_identifier(options.table + "_waiting") + " ON " + table +
            " (consumer, seq) WHERE parked_at IS NULL",
    };
    detail::prepare_schema(*pool, pool->options(), "outbox:" + options.table, steps,
                           "PostgresOutbox: create or migrate the table");
  }

  std::shared_ptr<ConnectionPool> pool;
  PostgresOutboxOptions options;
  std::string table;
  std::string channel;
  std::string insert;
  Statement lock_consumers;
  Statement select_rows;
  Statement delete_row;
  Statement refuse_row;
  Statement stats_query;
  Statement parked_rows;
  Statement unpark_rows;

  std::mutex listen_mutex;
  std::unique_ptr<detail::Connection> listener;  // guarded by listen_mutex

  // The relay transaction, open from take to settle (COMMIT) or destruction (ROLLBACK): its
  // advisory and row locks keep other relays off the batch's consumers and rows.
  class Batch final : public OutboxBatch {
   public:
    Batch(Impl& impl, ConnectionPool::Lease lease) : impl_(impl), lease_(std::move(lease)) {}

    void settle(std::span<const std::int64_t> confirmed,
                std::span<const Refusal> refused) override {
      constexpr std::string_view kCall = "PostgresOutbox::relay_batch";
      detail::Connection& connection = detail::PoolAccess::connection(lease_);
      for (const std::int64_t seq : confirmed) {
        Params params;
        params.int8(seq);
        connection.run(impl_.delete_row, params, kCall, StatementKind::read);
      }
      for (const Refusal& refusal : refused) {
        Params params;
        params.int8(refusal.seq).text(refusal.reason).boolean(refusal.park);
        connection.run(impl_.refuse_row, params, kCall, StatementKind::read);
      }
      connection.exec("COMMIT", kCall, StatementKind::commit);
      rollback_.disarm();
    }

    // The transaction holds nothing worth keeping (no row taken): end it now.
    void finish() {
      detail::PoolAccess::connection(lease_).exec("ROLLBACK", "PostgresOutbox::relay_batch",
                                                  StatementKind::read);
      rollback_.disarm();
    }

    detail::Connection& connection() { return detail::PoolAccess::connection(lease_); }

   private:
    Impl& impl_;
    ConnectionPool::Lease lease_;
    detail::RollbackGuard rollback_{lease_};  // after lease_: rolls back before it is returned
  };
};

PostgresOutbox::PostgresOutbox(PostgresOptions options, PostgresOutboxOptions outbox)
    : PostgresOutbox(std::make_shared<ConnectionPool>(std::move(options)), std::move(outbox)) {}

PostgresOutbox::PostgresOutbox(std::shared_ptr<ConnectionPool> pool, PostgresOutboxOptions outbox) {
  if (!pool) throw InvalidArgument("PostgresOutbox needs a connection pool (got null)");
  impl_ = std::make_unique<Impl>(std::move(pool), std::move(outbox));
}

PostgresOutbox::~PostgresOutbox() = default;

void PostgresOutbox::do_append(SqlTransaction& tx, std::string_view consumer,
                               std::string_view source_event_id, const Event& event) {
  const std::string headers = nlohmann::json(event.headers).dump();
  // The event's time as text the server parses: microseconds since the epoch.
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(event.timestamp.time_since_epoch())
          .count();
  const std::string ts = std::to_string(micros);
  // to_timestamp takes seconds as double precision: exact to the microsecond for today's dates.
  tx.exec(impl_->insert, {consumer, source_event_id, event.id, event.type,
                          SqlParam::blob(event.payload), headers, ts, impl_->channel});
}

std::unique_ptr<OutboxBatch> PostgresOutbox::do_take(std::size_t max_rows) {
  constexpr std::string_view kCall = "PostgresOutbox::relay_batch";
  auto batch = std::make_unique<Impl::Batch>(*impl_, impl_->pool->acquire());
  detail::Connection& connection = batch->connection();
  connection.exec("BEGIN", kCall, StatementKind::read);
  Params lock_params;
  lock_params.text(impl_->table);
  const Result locked =
      connection.run(impl_->lock_consumers, lock_params, kCall, StatementKind::read);
  std::vector<std::string> consumers;
  consumers.reserve(static_cast<std::size_t>(locked.rows()));
  for (int i = 0; i < locked.rows(); ++i)
    consumers.emplace_back(locked.bytes(i, 0));
  if (consumers.empty()) {
    batch->finish();
    return batch;
  }
  Params select_params;
  select_params.text_array(consumers).int8(static_cast<std::int64_t>(max_rows));
  const Result selected =
      connection.run(impl_->select_rows, select_params, kCall, StatementKind::read);
  batch->rows.reserve(static_cast<std::size_t>(selected.rows()));
  for (int i = 0; i < selected.rows(); ++i)
    batch->rows.push_back(read_row(selected, i));
  if (batch->rows.empty()) batch->finish();
  return batch;
}

bool PostgresOutbox::do_wait_for_rows(std::chrono::milliseconds timeout) {
  constexpr std::string_view kCall = "PostgresOutbox::wait_for_rows";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(impl_->listen_mutex);
  try {
    if (!impl_->listener || PQstatus(impl_->listener->raw()) != CONNECTION_OK) {
      impl_->listener = detail::PoolAccess::open_dedicated(*impl_->pool);
      impl_->listener->exec("LISTEN " + detail::quote_identifier(impl_->channel), kCall,
                            StatementKind::read);
    }
  } catch (const std::exception&) {
    impl_->listener.reset();
    lock.unlock();
    return Outbox::do_wait_for_rows(timeout);  // poll
  }
  PGconn* conn = impl_->listener->raw();
  const auto drain_notifies = [conn] {
    bool any = false;
    while (PGnotify* n = PQnotifies(conn)) {
      any = true;
      PQfreemem(n);
    }
    return any;
  };
  for (;;) {
    if (PQconsumeInput(conn) == 0) {
      impl_->listener.reset();  // reopened on the next wait
      return Outbox::do_wait_for_rows(std::chrono::milliseconds(0));
    }
    if (drain_notifies()) return true;
    // A commit in this process (or stop()) arrives without the server: check between slices.
    if (Outbox::do_wait_for_rows(std::chrono::milliseconds(0))) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto slice = std::min<std::chrono::steady_clock::duration>(deadline - now,
                                                                     std::chrono::milliseconds(20));
    pollfd fd{PQsocket(conn), POLLIN, 0};
    ::poll(
        &fd, 1,
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(slice).count()) + 1);
  }
}

OutboxStats PostgresOutbox::do_stats() {
  constexpr std::string_view kCall = "PostgresOutbox::stats";
  ConnectionPool::Lease lease = impl_->pool->acquire();
  const Result r = detail::PoolAccess::connection(lease).run(impl_->stats_query, Params{}, kCall,
                                                             StatementKind::read);
  OutboxStats stats;
  stats.depth = static_cast<std::uint64_t>(r.int8(0, 0));
  stats.parked = static_cast<std::uint64_t>(r.int8(0, 1));
  if (!r.is_null(0, 2)) {
    stats.oldest_age = std::chrono::milliseconds(std::max<std::int64_t>(r.int8(0, 2), 0));
  }
  return stats;
}

std::vector<OutboxRow> PostgresOutbox::do_parked(std::size_t limit) {
  constexpr std::string_view kCall = "PostgresOutbox::parked";
  ConnectionPool::Lease lease = impl_->pool->acquire();
  Params params;
  params.int8(static_cast<std::int64_t>(limit));
  const Result r = detail::PoolAccess::connection(lease).run(impl_->parked_rows, params, kCall,
                                                             StatementKind::read);
  std::vector<OutboxRow> rows;
  rows.reserve(static_cast<std::size_t>(r.rows()));
  for (int i = 0; i < r.rows(); ++i)
    rows.push_back(read_row(r, i));
  return rows;
}

std::size_t PostgresOutbox::do_unpark() {
  constexpr std::string_view kCall = "PostgresOutbox::unpark";
  ConnectionPool::Lease lease = impl_->pool->acquire();
  const Result r = detail::PoolAccess::connection(lease).run(impl_->unpark_rows, Params{}, kCall,
                                                             StatementKind::write);
  return static_cast<std::size_t>(r.affected());
}

}  // namespace idem::postgres
