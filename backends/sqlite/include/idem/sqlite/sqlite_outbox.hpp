// SqliteOutbox: the outbox (idem/outbox.hpp) in the recorder's SQLite file.
//
// Rows live in `idem_outbox(seq INTEGER PRIMARY KEY AUTOINCREMENT, consumer, source_event_id,
// event_id, event_type, payload BLOB, headers (JSON text), event_ts_ms, created_ms, attempts,
// last_error, parked_ms)`, created when missing. A transactional handler's follow-ups are
// inserted through its SqliteTransaction, so they commit with the marker; SQLite has one writer
// at a time, so `seq` order is commit order.
//
// Relay passes (Outbox::relay_batch, written once in idem::Outbox; this class supplies its SQL
// steps, take and settle): one relay at a time per file, across threads and processes: the relay
// holds an exclusive flock() on "<path>-outbox.lock" (released by the kernel if the process dies)
// while it reads rows, publishes them and deletes the confirmed ones; a relay that finds it held
// returns busy. The write lock of the database is held only for the final delete/update
// transaction, never while the broker is awaited, so handlers keep committing meanwhile.
//
// Errors: as SqliteIdempotencyRecorder (SqliteError with stable codes); ":memory:" is refused
// (InvalidArgument: a private in-memory database cannot be shared with a recorder).
//
// Thread-safety: thread-safe (one connection behind a mutex). fork(): as every SQLite object,
// an outbox made before fork() belongs to the parent.
#pragma once

#include <memory>
#include <string>

#include "idem/outbox.hpp"
#include "idem/sqlite/sqlite_options.hpp"

namespace idem::sqlite {

class SqliteOutbox final : public Outbox {
 public:
  // Opens `path` (the recorder's file; created when missing unless options.read_only or
  // !options.create_schema), switches it to WAL and creates idem_outbox when missing.
  explicit SqliteOutbox(std::string path, SqliteOptions options = {});
  ~SqliteOutbox() override;
  SqliteOutbox(const SqliteOutbox&) = delete;
  SqliteOutbox& operator=(const SqliteOutbox&) = delete;

  const std::string& path() const noexcept;

 private:
  void do_append(SqlTransaction& tx, std::string_view consumer, std::string_view source_event_id,
                 const Event& event) override;
  std::unique_ptr<OutboxBatch> do_take(std::size_t max_rows) override;
  OutboxStats do_stats() override;
  std::vector<OutboxRow> do_parked(std::size_t limit) override;
  std::size_t do_unpark() override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::sqlite
