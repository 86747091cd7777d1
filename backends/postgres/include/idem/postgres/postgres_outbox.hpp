// PostgresOutbox: the outbox (idem/outbox.hpp) in the recorder's PostgreSQL database.
//
// Rows live in `<schema>.idem_outbox(seq bigint identity, consumer, source_event_id, event_id,
// event_type, payload bytea, headers jsonb, event_ts, created_at, attempts, last_error,
// parked_at)`, created (versioned, under the schema's advisory lock) when missing. A
// transactional handler's follow-ups are inserted through its PostgresTransaction, with a
// pg_notify on the table's channel that the server delivers at COMMIT.
//
// Relay passes (Outbox::relay_batch, written once in idem::Outbox; this class supplies its SQL
// steps, take and settle): in one transaction, takes a transaction-scoped advisory lock per
// consumer with waiting rows (pg_try_advisory_xact_lock: a consumer another relay is working on is
// skipped), then reads those consumers' oldest rows with FOR UPDATE SKIP LOCKED, publishes them,
// deletes the confirmed ones and commits. So several relay processes never publish a row twice at
// once, and each consumer's rows go out in `seq` order. (`seq` is taken at INSERT: two transactions
// of one consumer committing at once may go out in either order.) The transaction (one pooled
// connection) is open while the broker is awaited; a relay that dies rolls it back and its rows
// are taken again.
//
// wait_for_rows(): LISTEN on a dedicated connection, so a commit in any process wakes the relay;
// a commit in this process wakes it too (notify_committed). If the connection is lost it polls.
//
// Errors: PostgresError as the recorder. Thread-safety: thread-safe.
#pragma once

#include <memory>
#include <string>

#include "idem/outbox.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres {

struct PostgresOutboxOptions {
  // The table, in the pool's options.schema. Default "idem_outbox". Also the LISTEN channel.
  std::string table = "idem_outbox";
};

class PostgresOutbox final : public Outbox {
 public:
  explicit PostgresOutbox(PostgresOptions options, PostgresOutboxOptions outbox = {});
  // Shares `pool` with recorders or stores (it must reach the recorder's database).
  explicit PostgresOutbox(std::shared_ptr<ConnectionPool> pool, PostgresOutboxOptions outbox = {});
  ~PostgresOutbox() override;
  PostgresOutbox(const PostgresOutbox&) = delete;
  PostgresOutbox& operator=(const PostgresOutbox&) = delete;

 private:
  void do_append(SqlTransaction& tx, std::string_view consumer, std::string_view source_event_id,
                 const Event& event) override;
  std::unique_ptr<OutboxBatch> do_take(std::size_t max_rows) override;
  bool do_wait_for_rows(std::chrono::milliseconds timeout) override;
  OutboxStats do_stats() override;
  std::vector<OutboxRow> do_parked(std::size_t limit) override;
  std::size_t do_unpark() override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::postgres
