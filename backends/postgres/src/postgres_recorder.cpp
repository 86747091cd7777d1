#include "idem/postgres/postgres_recorder.hpp"

#include <libpq-fe.h>

#include <exception>
#include <limits>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "idem/error.hpp"
#include "schema.hpp"

namespace idem::postgres {

namespace {

using detail::kInt8Oid;
using detail::kTextArrayOid;
using detail::kTextOid;
using detail::kTimestamptzOid;
using detail::Params;
using detail::Statement;

// The base class has checked the keys; PostgreSQL also needs them as UTF-8 text.
void validate(std::string_view consumer, std::string_view event_id) {
  detail::require_utf8_key("consumer", consumer);
  detail::require_utf8_key("event id", event_id);
}

// Tokens are bigint in the database; a larger one was never issued.
bool fits_token(std::uint64_t token) noexcept {
  return token <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

// A claim statement can lose a race twice in a row only when other callers keep claiming and
// releasing the same event; after this many rounds the caller gets a retryable error.
constexpr int kClaimRounds = 16;

// Ids per statement of is_processed_many() / mark_processed_many(): bounds one statement's
// parameter and result size (a window of deliveries is far smaller).
constexpr std::size_t kBatchChunk = 1000;

// Markers deleted per transaction by purge(): bounds the transaction's row locks and WAL.
constexpr int kPurgeChunkRows = 1000;

}  // namespace

class PostgresIdempotencyRecorder::Impl {
 public:
  explicit Impl(std::shared_ptr<ConnectionPool> shared_pool)
      : pool(std::move(shared_pool)),
        clock(pool->options().clock ? pool->options().clock : system_clock()),
        schema(detail::quote_identifier(pool->options().schema)),
        log(schema + "." + detail::quote_identifier(pool->options().processed_log_table)),
        claims(schema + "." + detail::quote_identifier(pool->options().claims_table)),
        sequence(schema + "." +
                 detail::quote_identifier(pool->options().claims_table + "_token_seq")),
        select_marker("SELECT 1 FROM " + log + " WHERE consumer = $1 AND event_id = $2",
                      {kTextOid, kTextOid}),
        // The ids as one text[] parameter (one statement per batch, no SQL built from ids),
        // each looked up by its own primary-key probe: a LATERAL subquery with LIMIT is never
        // flattened into a join, so its plain equality is always an index condition on both
        // columns. `consumer = $1 AND event_id = ANY ($2)` left the planner free to scan the
        // consumer's every marker with the ids as a filter, which it chose whenever statistics
        // said the consumer had few markers: a new consumer, or a table not analyzed since
        // (DESIGN-NOTES §29, §31). Prepared: this plan is the best at any size, so the generic
        // plan is too (planning every run cost a third of a small batch's check).
        select_markers_many(
            "SELECT ids.id FROM unnest($2::text[]) AS ids (id) CROSS JOIN "
            "LATERAL (SELECT 1 FROM " +
                log + " WHERE consumer = $1 AND event_id = ids.id LIMIT 1) AS hit",
            {kTextOid, kTextArrayOid}),
        // DISTINCT: a batch may repeat an id, and one INSERT must not meet its own row twice.
        insert_markers_many("INSERT INTO " + log +
                                " (consumer, event_id, ts) SELECT DISTINCT $1::text, id, $3 "
                                "FROM unnest($2::text[]) AS id "
                                "ON CONFLICT (consumer, event_id) DO NOTHING",
                            {kTextOid, kTextArrayOid, kTimestamptzOid}),
        insert_marker("INSERT INTO " + log +
                          " (consumer, event_id, ts) VALUES ($1, $2, $3) "
                          "ON CONFLICT (consumer, event_id) DO NOTHING",
                      {kTextOid, kTextOid, kTimestamptzOid}),
        // One statement: the marker check, the claim itself (insert, or take over a claim whose
        // lease passed — never a done one), and the row as this statement's snapshot saw it.
        claim("WITH marker AS (SELECT 1 FROM " + log +
                  " WHERE consumer = $1 AND event_id = $2), "
                  "existing AS (SELECT lease_until, done_at FROM " +
                  claims +
                  " WHERE consumer = $1 AND event_id = $2), "
                  "claimed AS (INSERT INTO " +
                  claims +
                  " AS c (consumer, event_id, token, lease_until) "
                  "SELECT $1, $2, nextval('" +
                  sequence +
                  "'), $4 "
                  "WHERE NOT EXISTS (SELECT 1 FROM marker) "
                  "ON CONFLICT (consumer, event_id) DO UPDATE SET token = excluded.token, "
                  "lease_until = excluded.lease_until, took_over = true "
                  "WHERE c.done_at IS NULL AND c.lease_until <= $3 "
                  "RETURNING token, lease_until, took_over) "
                  "SELECT 'acquired'::text, token, lease_until, took_over FROM claimed "
                  "UNION ALL SELECT 'processed', NULL, NULL, NULL FROM marker "
                  "UNION ALL SELECT CASE WHEN done_at IS NULL THEN 'claimed' ELSE 'processed' END, "
                  "NULL, lease_until, NULL FROM existing",
              {kTextOid, kTextOid, kTimestamptzOid, kTimestamptzOid}),
        // Read again with a fresh snapshot when the claim statement raced with another writer.
        reread("SELECT EXISTS (SELECT 1 FROM " + log +
                   " WHERE consumer = $1 AND event_id = $2), c.lease_until, c.done_at IS NOT NULL "
                   "FROM (SELECT 1) AS one LEFT JOIN " +
                   claims + " AS c ON c.consumer = $1 AND c.event_id = $2",
               {kTextOid, kTextOid}),
        // The claim stays, marked done, so a claim racing with this complete finds it (and
        // waits for its row lock) instead of inserting a new claim next to the new marker.
        complete("WITH done AS (UPDATE " + claims +
                     " SET done_at = $4 WHERE consumer = $1 AND event_id = $2 AND token = $3 "
                     "AND done_at IS NULL RETURNING 1), "
                     "marked AS (INSERT INTO " +
                     log +
                     " (consumer, event_id, ts) SELECT $1, $2, $4 FROM done "
                     "ON CONFLICT (consumer, event_id) DO NOTHING) "
                     "SELECT count(*) FROM done",
                 {kTextOid, kTextOid, kInt8Oid, kTimestamptzOid}),
        release("DELETE FROM " + claims +
                    " WHERE consumer = $1 AND event_id = $2 AND token = $3 AND done_at IS NULL",
                {kTextOid, kTextOid, kInt8Oid}),
        renew("UPDATE " + claims +
                  " SET lease_until = $4 WHERE consumer = $1 AND event_id = $2 AND token = $3 "
                  "AND done_at IS NULL",
              {kTextOid, kTextOid, kInt8Oid, kTimestamptzOid}),
        // Inside run_transactional's transaction: the marker, and a done claim that fences any
        // exclusive-mode owner (a dead claim is replaced; a live one makes `fence` empty).
        transactional_mark("WITH marker AS (INSERT INTO " + log +
                               " (consumer, event_id, ts) VALUES ($1, $2, $3) "
                               "ON CONFLICT (consumer, event_id) DO NOTHING RETURNING 1), "
                               "fence AS (INSERT INTO " +
                               claims +
                               " AS c (consumer, event_id, token, lease_until, done_at) "
                               "SELECT $1, $2, nextval('" +
                               sequence +
                               "'), $3, $3 FROM marker "
                               "ON CONFLICT (consumer, event_id) DO UPDATE SET token = "
                               "excluded.token, lease_until = excluded.lease_until, "
                               "done_at = excluded.done_at, took_over = true "
                               "WHERE c.done_at IS NULL AND c.lease_until <= $3 RETURNING 1) "
                               "SELECT (SELECT count(*) FROM marker), (SELECT count(*) FROM fence)",
                           {kTextOid, kTextOid, kTimestamptzOid}),
        // One chunk of purge(): at most kPurgeChunkRows old markers after the key ($2, $3), in
        // primary-key order (the walk resumes where the last chunk stopped, so every chunk reads
        // only its part of the index); returns how many went and the chunk's last key. Planned
        // per run, so a purge scheduled from a table's first day keeps using the index.
        purge_chunk("WITH doomed AS (SELECT consumer, event_id FROM " + log +
                        " WHERE (consumer, event_id) > ($2, $3) AND ts < $1 "
                        "ORDER BY consumer, event_id LIMIT " +
                        std::to_string(kPurgeChunkRows) + "), gone AS (DELETE FROM " + log +
                        " AS l USING doomed AS d WHERE l.consumer = d.consumer AND "
                        "l.event_id = d.event_id RETURNING 1) "
                        "SELECT (SELECT count(*) FROM gone), consumer, event_id FROM doomed "
                        "ORDER BY consumer DESC, event_id DESC LIMIT 1",
                    {kTimestamptzOid, kTextOid, kTextOid}, detail::Planning::per_run),
        purge_claims("DELETE FROM " + claims + " WHERE coalesce(done_at, lease_until) < $1",
                     {kTimestamptzOid}),
        count_old_markers("SELECT count(*) FROM " + log + " WHERE ts < $1", {kTimestamptzOid}),
        count_markers("SELECT consumer, count(*) FROM " + log + " GROUP BY consumer", {}),
        count_live_claims("SELECT consumer, count(*) FROM " + claims +
                              " WHERE done_at IS NULL AND lease_until > $1 GROUP BY consumer",
                          {kTimestamptzOid}),
        inspect("SELECT (SELECT ts FROM " + log +
                    " WHERE consumer = $1 AND event_id = $2), c.token, c.lease_until "
                    "FROM (SELECT 1) AS one LEFT JOIN " +
                    claims + " AS c ON c.consumer = $1 AND c.event_id = $2 AND c.done_at IS NULL",
                {kTextOid, kTextOid}) {}

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
    ConnectionPool::Lease lease = pool->acquire();
    try {
      detail::prepare_schema(lease.connection(), options,
                             "recorder:" + options.processed_log_table + "," + options.claims_table,
                             steps, "PostgresIdempotencyRecorder: create or migrate the tables");
    } catch (...) {
      lease.mark_broken();
      throw;
    }
  }

  // Runs one statement on a pooled connection. A failure that leaves the connection unusable
  // drops it when the lease ends.
  detail::Result run(const Statement& statement, const Params& params, std::string_view call,
                     StatementKind kind) {
    ConnectionPool::Lease lease = pool->acquire();
    return lease.connection().run(statement, params, call, kind);
  }

  std::shared_ptr<ConnectionPool> pool;
  std::shared_ptr<Clock> clock;
  std::string schema;
  std::string log;
  std::string claims;
  std::string sequence;

  Statement select_marker;
  Statement select_markers_many;
  Statement insert_markers_many;
  Statement insert_marker;
  Statement claim;
  Statement reread;
  Statement complete;
  Statement release;
  Statement renew;
  Statement transactional_mark;
  Statement purge_chunk;
  Statement purge_claims;
  Statement count_old_markers;
  Statement count_markers;
  Statement count_live_claims;
  Statement inspect;
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
  validate(consumer, event_id);
  Params params;
  params.text(consumer).text(event_id);
  return impl_
             ->run(impl_->select_marker, params, "PostgresIdempotencyRecorder::is_processed",
                   StatementKind::read)
             .rows() > 0;
}

void PostgresIdempotencyRecorder::do_mark_processed(std::string_view consumer,
                                                    std::string_view event_id) {
  validate(consumer, event_id);
  Params params;
  params.text(consumer).text(event_id).timestamptz(impl_->clock->wall_now());
  impl_->run(impl_->insert_marker, params, "PostgresIdempotencyRecorder::mark_processed",
             StatementKind::write);
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
    results.push_back(lease.connection().run(impl_->select_markers_many, params,
                                             "PostgresIdempotencyRecorder::is_processed_many",
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
    lease.connection().run(impl_->insert_markers_many, params,
                           "PostgresIdempotencyRecorder::mark_processed_many",
                           StatementKind::write);
  }
}

Claim PostgresIdempotencyRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                            Millis lease) {
  validate(consumer, event_id);
  constexpr std::string_view kCall = "PostgresIdempotencyRecorder::claim";
  ConnectionPool::Lease connection = impl_->pool->acquire();
  for (int round = 0; round < kClaimRounds; ++round) {
    const WallTime now = impl_->clock->wall_now();
    const WallTime lease_until = detail::add_saturating(now, lease);
    Params params;
    params.text(consumer).text(event_id).timestamptz(now).timestamptz(lease_until);
    const detail::Result result =
        connection.connection().run(impl_->claim, params, kCall, StatementKind::write);
    // Rows come in no particular order: an acquisition wins, then a marker, then a live claim.
    bool processed = false;
    bool seen_live = false;
    WallTime seen_lease_until{};
    for (int row = 0; row < result.rows(); ++row) {
      const std::string_view kind = result.bytes(row, 0);
      if (kind == "acquired") {
        Claim acquired{Claim::Status::acquired};
        acquired.token = static_cast<std::uint64_t>(result.int8(row, 1));
        acquired.lease_until = result.timestamptz(row, 2);
        acquired.took_over = result.boolean(row, 3);
        return acquired;
      }
      if (kind == "processed") processed = true;
      if (kind == "claimed" && result.timestamptz(row, 2) > now) {
        seen_live = true;
        seen_lease_until = result.timestamptz(row, 2);
      }
    }
    if (processed) return Claim{Claim::Status::processed};
    if (seen_live) {
      Claim busy{Claim::Status::in_progress};
      busy.lease_until = seen_lease_until;
      return busy;
    }
    // The statement's snapshot saw no claim, or one whose lease had passed, and yet could not
    // claim: another writer got there first. Look again with a fresh snapshot.
    Params key;
    key.text(consumer).text(event_id);
    const detail::Result again =
        connection.connection().run(impl_->reread, key, kCall, StatementKind::read);
    if (again.boolean(0, 0)) return Claim{Claim::Status::processed};
    if (!again.is_null(0, 1)) {
      if (again.boolean(0, 2)) return Claim{Claim::Status::processed};
      if (again.timestamptz(0, 1) > now) {
        Claim busy{Claim::Status::in_progress};
        busy.lease_until = again.timestamptz(0, 1);
        return busy;
      }
    }
    // Released (or its lease passed) in between: claim again.
  }
  throw PostgresError(ErrorCode::store_busy,
                      std::string(kCall) + " on " + impl_->pool->target() + ": (" +
                          std::string(consumer) + ", " + std::string(event_id) +
                          ") kept changing under " + std::to_string(kClaimRounds) +
                          " claim attempts",
                      "", /*retryable=*/true, false);
}

bool PostgresIdempotencyRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                              std::uint64_t token) {
  validate(consumer, event_id);
  if (!fits_token(token)) return false;
  Params params;
  params.text(consumer)
      .text(event_id)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(impl_->clock->wall_now());
  const detail::Result result = impl_->run(
      impl_->complete, params, "PostgresIdempotencyRecorder::complete", StatementKind::write);
  return result.int8(0, 0) > 0;
}

bool PostgresIdempotencyRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                             std::uint64_t token) {
  validate(consumer, event_id);
  if (!fits_token(token)) return false;
  Params params;
  params.text(consumer).text(event_id).int8(static_cast<std::int64_t>(token));
  return impl_
             ->run(impl_->release, params, "PostgresIdempotencyRecorder::release",
                   StatementKind::write)
             .affected() > 0;
}

bool PostgresIdempotencyRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token, Millis lease) {
  validate(consumer, event_id);
  if (!fits_token(token)) return false;
  Params params;
  params.text(consumer)
      .text(event_id)
      .int8(static_cast<std::int64_t>(token))
      .timestamptz(detail::add_saturating(impl_->clock->wall_now(), lease));
  return impl_
             ->run(impl_->renew, params, "PostgresIdempotencyRecorder::renew", StatementKind::write)
             .affected() > 0;
}

bool PostgresIdempotencyRecorder::do_run_transactional(
    std::string_view consumer, std::string_view event_id,
    const std::function<void(Transaction&)>& fn) {
  validate(consumer, event_id);
  constexpr std::string_view kCall = "PostgresIdempotencyRecorder::run_transactional";
  ConnectionPool::Lease lease = impl_->pool->acquire();
  detail::Connection& connection = lease.connection();
  // Until COMMIT succeeds, any way out rolls back; a connection that cannot be rolled back
  // (lost, or in an unknown state) is dropped, which makes the server roll back.
  struct Rollback {
    ConnectionPool::Lease& lease;
    bool armed = true;
    ~Rollback() {
      if (!armed) return;
      PGconn* conn = lease.get();
      if (PQstatus(conn) != CONNECTION_OK) {
        lease.mark_broken();
        return;
      }
      if (PQtransactionStatus(conn) == PQTRANS_IDLE) return;
      PGresult* result = PQexec(conn, "ROLLBACK");
      const bool ok = result != nullptr && PQresultStatus(result) == PGRES_COMMAND_OK;
      PQclear(result);
      if (!ok || PQtransactionStatus(conn) != PQTRANS_IDLE) lease.mark_broken();
    }
  } rollback{lease};

  connection.exec("BEGIN", kCall, StatementKind::read);
  Params params;
  params.text(consumer).text(event_id).timestamptz(impl_->clock->wall_now());
  const detail::Result marked =
      connection.run(impl_->transactional_mark, params, kCall, StatementKind::read);
  if (marked.int8(0, 0) == 0) return false;  // already processed: roll back, do not run
  if (marked.int8(0, 1) == 0) {
    Params key;
    key.text(consumer).text(event_id);
    const detail::Result claim = connection.run(impl_->reread, key, kCall, StatementKind::read);
    if (!claim.is_null(0, 1) && claim.boolean(0, 2)) return false;  // done by a claim
    throw AlreadyInProgress("(" + std::string(consumer) + ", " + std::string(event_id) +
                            ") is claimed by another delivery whose lease has not passed");
  }

  PostgresTransaction handle(connection, consumer, event_id);
  fn(handle);  // throws → Rollback undoes the marker and fn's writes

  switch (PQtransactionStatus(connection.raw())) {
    case PQTRANS_INTRANS:
      break;
    case PQTRANS_INERROR:
      throw PostgresError(ErrorCode::store_error,
                          std::string(kCall) + " on " + connection.target() +
                              ": a statement of "
                              "the handler for (" +
                              std::string(consumer) + ", " + std::string(event_id) +
                              ") failed and the handler went on; the transaction was rolled back "
                              "(nothing was marked)",
                          "25P02", /*retryable=*/false, false);
    default:
      rollback.armed = false;
      lease.mark_broken();
      throw PostgresError(ErrorCode::store_error,
                          std::string(kCall) + " on " + connection.target() +
                              ": the handler for (" + std::string(consumer) + ", " +
                              std::string(event_id) +
                              ") ended idem's transaction itself (COMMIT/ROLLBACK through "
                              "connection()); whether its writes and the marker were committed "
                              "is unknown",
                          "", /*retryable=*/false, /*in_doubt=*/true);
  }
  const detail::Result committed = connection.exec("COMMIT", kCall, StatementKind::commit);
  // COMMIT of a transaction the server had already aborted answers ROLLBACK, not an error.
  if (std::string_view(PQcmdStatus(committed.get())) != "COMMIT") {
    throw PostgresError(ErrorCode::store_error,
                        std::string(kCall) + " on " + connection.target() +
                            ": the server rolled the transaction back at COMMIT",
                        "", /*retryable=*/true, false);
  }
  rollback.armed = false;
  return true;
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
  const detail::Result markers =
      lease.connection().run(impl_->count_markers, Params{}, kCall, StatementKind::read);
  for (int row = 0; row < markers.rows(); ++row) {
    entry(markers.bytes(row, 0)).processed = static_cast<std::uint64_t>(markers.int8(row, 1));
  }
  Params params;
  params.timestamptz(impl_->clock->wall_now());
  const detail::Result claims =
      lease.connection().run(impl_->count_live_claims, params, kCall, StatementKind::read);
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
  validate(consumer, event_id);
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
