#include "idem/postgres/postgres_recorder.hpp"

#include <libpq-fe.h>

#include <exception>
#include <limits>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "claim_logic.hpp"
#include "connection.hpp"
#include "idem/error.hpp"
#include "pool_access.hpp"
#include "rollback_guard.hpp"
#include "schema.hpp"
#include "sql_text.hpp"
#include "steps.hpp"

namespace idem::postgres {

namespace {

using detail::Params;
using detail::Statement;

using detail::fits_token;
using detail::require_utf8_marker;

// Ids per statement of is_processed_many() / mark_processed_many(): bounds one statement's
// parameter and result size (a window of deliveries is far smaller).
constexpr std::size_t kBatchChunk = 1000;

}  // namespace

class PostgresIdempotencyRecorder::Impl : public detail::RecorderSql, public detail::PooledRunner {
 public:
  explicit Impl(std::shared_ptr<ConnectionPool> shared_pool)
      : RecorderSql(shared_pool->options()),
        PooledRunner(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()) {}

  void create_tables() {
    const PostgresOptions& options = pool->options();
    const std::vector<std::string> steps = {
        // version 1
        "CREATE TABLE IF NOT EXISTS " + log +
            " (consumer text NOT NULL, event_id text NOT NULL, ts timestamptz NOT NULL, "
            "PRIMARY KEY (consumer, event_id)); "
            "CREATE SEQUENCE IF NOT EXISTS " +
            sequence +
            " AS bigint; "
            "CREATE TABLE IF NOT EXISTS " +
            claims +
            " (consumer text NOT NULL, event_id text NOT NULL, token bigint NOT NULL, "
            "lease_until timestamptz NOT NULL, done_at timestamptz, "
            "took_over boolean NOT NULL DEFAULT false, PRIMARY KEY (consumer, event_id))",
    };
    static_assert(kSchemaVersion == 1, "add the migration step for the new version");
    detail::prepare_schema(*pool, options,
                           "recorder:" + options.processed_log_table + "," + options.claims_table,
                           steps, "PostgresIdempotencyRecorder: create or migrate the tables");
  }

  std::shared_ptr<Clock> clock;
};

PostgresIdempotencyRecorder::PostgresIdempotencyRecorder(PostgresOptions options)
    : PostgresIdempotencyRecorder(std::make_shared<ConnectionPool>(std::move(options))) {}

PostgresIdempotencyRecorder::PostgresIdempotencyRecorder(std::shared_ptr<ConnectionPool> pool) {
  if (!pool)
    throw InvalidArgument("PostgresIdempotencyRecorder needs a connection pool (got null)");
  impl_ = std::make_unique<Impl>(std::move(pool));
  impl_->create_tables();
}

PostgresIdempotencyRecorder::~PostgresIdempotencyRecorder() = default;

const std::shared_ptr<ConnectionPool>& PostgresIdempotencyRecorder::pool() const noexcept {
  return impl_->pool;
}

bool PostgresIdempotencyRecorder::do_is_processed(std::string_view consumer,
                                                  std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  return impl_->answer(detail::recorder_is_processed(*impl_, consumer, event_id),
                       "PostgresIdempotencyRecorder::is_processed");
}

void PostgresIdempotencyRecorder::do_mark_processed(std::string_view consumer,
                                                    std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  impl_->run(detail::recorder_mark(*impl_, consumer, event_id, impl_->clock->wall_now()),
             "PostgresIdempotencyRecorder::mark_processed");
}

std::vector<bool> PostgresIdempotencyRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  detail::require_utf8_key("consumer", consumer);
  for (const std::string& event_id : event_ids)
    detail::require_utf8_key("event id", event_id);
  std::vector<bool> processed(event_ids.size(), false);
  if (event_ids.empty()) return processed;
  ConnectionPool::Lease lease = impl_->pool->acquire();
  std::unordered_set<std::string_view> found;
  std::vector<detail::Result> results;  // `found` points into their rows
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const auto chunk = event_ids.subspan(offset, std::min(kBatchChunk, event_ids.size() - offset));
    Params params;
    params.text(consumer).text_array(chunk);
    results.push_back(detail::PoolAccess::connection(lease).run(
        impl_->select_markers_many, params, "PostgresIdempotencyRecorder::is_processed_many",
        StatementKind::read));
    const detail::Result& result = results.back();
    for (int row = 0; row < result.rows(); ++row)
      found.insert(result.bytes(row, 0));
  }
  for (std::size_t i = 0; i < event_ids.size(); ++i)
    processed[i] = found.contains(event_ids[i]);
  return processed;
}

void PostgresIdempotencyRecorder::do_mark_processed_many(std::string_view consumer,
                                                         std::span<const std::string> event_ids) {
  detail::require_utf8_key("consumer", consumer);
  for (const std::string& event_id : event_ids)
    detail::require_utf8_key("event id", event_id);
  if (event_ids.empty()) return;
  const WallTime now = impl_->clock->wall_now();
  ConnectionPool::Lease lease = impl_->pool->acquire();
  for (std::size_t offset = 0; offset < event_ids.size(); offset += kBatchChunk) {
    const auto chunk = event_ids.subspan(offset, std::min(kBatchChunk, event_ids.size() - offset));
    Params params;
    params.text(consumer).text_array(chunk).timestamptz(now);
    detail::PoolAccess::connection(lease).run(impl_->insert_markers_many, params,
                                              "PostgresIdempotencyRecorder::mark_processed_many",
                                              StatementKind::write);
  }
}

Claim PostgresIdempotencyRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                            Millis lease) {
  require_utf8_marker(consumer, event_id);
  constexpr std::string_view kCall = "PostgresIdempotencyRecorder::claim";
  ConnectionPool::Lease lease_of_pool = impl_->pool->acquire();
  detail::RecorderClaim claim(*impl_, *impl_->clock, consumer, event_id, lease, kCall,
                              impl_->pool->target());
  while (!claim.read(
      detail::run_step(detail::PoolAccess::connection(lease_of_pool), claim.step(), kCall))) {
  }
  return claim.outcome();
}

bool PostgresIdempotencyRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                              std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) return false;
  return impl_->answer(
      detail::recorder_complete(*impl_, consumer, event_id, token, impl_->clock->wall_now()),
      "PostgresIdempotencyRecorder::complete");
}

bool PostgresIdempotencyRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                             std::uint64_t token) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) return false;
  return impl_->answer(detail::recorder_release(*impl_, consumer, event_id, token),
                       "PostgresIdempotencyRecorder::release");
}

bool PostgresIdempotencyRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token, Millis lease) {
  require_utf8_marker(consumer, event_id);
  if (!fits_token(token)) return false;
  return impl_->answer(
      detail::recorder_renew(*impl_, consumer, event_id, token,
                             detail::add_saturating(impl_->clock->wall_now(), lease)),
      "PostgresIdempotencyRecorder::renew");
}

bool PostgresIdempotencyRecorder::do_run_transactional(
    std::string_view consumer, std::string_view event_id,
    const std::function<void(Transaction&)>& fn) {
  require_utf8_marker(consumer, event_id);
  constexpr std::string_view kCall = "PostgresIdempotencyRecorder::run_transactional";
  ConnectionPool::Lease lease = impl_->pool->acquire();
  detail::Connection& connection = detail::PoolAccess::connection(lease);
  detail::TransactionalMark mark(*impl_, consumer, event_id, impl_->clock->wall_now(), kCall,
                                 connection.target());
  detail::RollbackGuard rollback(lease);  // undoes the marker and fn's writes on any way out
  try {
    for (;;) {
      switch (mark.action()) {
        case detail::TransactionalMark::Action::send:
          mark.read(detail::run_step(connection, mark.step(), kCall));
          break;
        case detail::TransactionalMark::Action::run_handler: {
          PostgresTransaction handle(connection, consumer, event_id);
          fn(handle);
          mark.handler_ran(PQtransactionStatus(connection.raw()));
          break;
        }
        case detail::TransactionalMark::Action::done:
          if (!mark.in_transaction()) rollback.disarm();  // committed
          return mark.ran();
      }
    }
  } catch (...) {
    if (mark.broken()) {
      rollback.disarm();
      lease.mark_broken();  // its state is unknown: the server rolls back when it closes
    }
    throw;
  }
}

namespace {

WallTime purge_cutoff(const Clock& clock, std::chrono::system_clock::duration older_than) {
  return detail::add_saturating(clock.wall_now(),
                                -std::chrono::duration_cast<std::chrono::nanoseconds>(older_than));
}

}  // namespace

std::size_t PostgresIdempotencyRecorder::do_purge(std::chrono::system_clock::duration older_than,
                                                  const PurgeProgress& progress) {
  const WallTime cutoff = purge_cutoff(*impl_->clock, older_than);
  std::size_t markers = 0;
  // Keys are never empty (validate_key), so ('', '') is below every key idem wrote.
  std::string after_consumer;
  std::string after_event;
  for (;;) {
    Params params;
    params.timestamptz(cutoff).text(after_consumer).text(after_event);
    const detail::Result chunk = impl_->run(
        impl_->purge_chunk, params, "PostgresIdempotencyRecorder::purge", StatementKind::write);
    if (chunk.rows() == 0) break;  // no old marker after the last key
    const auto removed = static_cast<std::size_t>(chunk.int8(0, 0));
    after_consumer = std::string(chunk.bytes(0, 1));
    after_event = std::string(chunk.bytes(0, 2));
    markers += removed;
    if (removed > 0 && progress) progress(markers);
  }
  Params params;
  params.timestamptz(cutoff);
  impl_->run(impl_->purge_claims, params, "PostgresIdempotencyRecorder::purge",
             StatementKind::write);
  return markers;
}

std::size_t PostgresIdempotencyRecorder::do_count_purgeable(
    std::chrono::system_clock::duration older_than) {
  Params params;
  params.timestamptz(purge_cutoff(*impl_->clock, older_than));
  const detail::Result result =
      impl_->run(impl_->count_old_markers, params, "PostgresIdempotencyRecorder::count_purgeable",
                 StatementKind::read);
  return static_cast<std::size_t>(result.int8(0, 0));
}

std::vector<ConsumerCounts> PostgresIdempotencyRecorder::do_consumer_counts() {
  constexpr std::string_view kCall = "PostgresIdempotencyRecorder::consumer_counts";
  std::map<std::string, ConsumerCounts, std::less<>> by_name;
  const auto entry = [&](std::string_view name) -> ConsumerCounts& {
    auto& counts = by_name[std::string(name)];
    counts.consumer = std::string(name);
    return counts;
  };
  ConnectionPool::Lease lease = impl_->pool->acquire();
  const detail::Result markers = detail::PoolAccess::connection(lease).run(
      impl_->count_markers, Params{}, kCall, StatementKind::read);
  for (int row = 0; row < markers.rows(); ++row) {
    entry(markers.bytes(row, 0)).processed = static_cast<std::uint64_t>(markers.int8(row, 1));
  }
  Params params;
  params.timestamptz(impl_->clock->wall_now());
  const detail::Result claims = detail::PoolAccess::connection(lease).run(
      impl_->count_live_claims, params, kCall, StatementKind::read);
  for (int row = 0; row < claims.rows(); ++row) {
    entry(claims.bytes(row, 0)).in_progress = static_cast<std::uint64_t>(claims.int8(row, 1));
  }
  // Sorted by the bytes of the name (std::map), not by the database's collation, so every
  // backend lists consumers in the same order.
  std::vector<ConsumerCounts> result;
  result.reserve(by_name.size());
  for (auto& [name, counts] : by_name)
    result.push_back(std::move(counts));
  return result;
}

MarkerInspection PostgresIdempotencyRecorder::do_inspect(std::string_view consumer,
                                                         std::string_view event_id) {
  require_utf8_marker(consumer, event_id);
  Params params;
  params.text(consumer).text(event_id);
  const detail::Result row = impl_->run(
      impl_->inspect, params, "PostgresIdempotencyRecorder::inspect", StatementKind::read);
  MarkerInspection result;
  if (row.rows() == 0) return result;
  if (!row.is_null(0, 0)) {
    result.processed = true;
    result.processed_at = row.timestamptz(0, 0);
  }
  if (!row.is_null(0, 1)) {
    const WallTime lease_until = row.timestamptz(0, 2);
    result.claim = MarkerInspection::OpenClaim{static_cast<std::uint64_t>(row.int8(0, 1)),
                                               lease_until, lease_until > impl_->clock->wall_now()};
  }
  return result;
}

}  // namespace idem::postgres
