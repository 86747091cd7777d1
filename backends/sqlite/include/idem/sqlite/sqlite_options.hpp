// Options for idem's SQLite backend.
//
// One SQLite file can be shared by several threads and several processes on one machine: idem
// opens it in WAL mode (readers never block the writer, one writer at a time) and waits up to
// `busy_timeout` for the write lock another connection holds. What a successful write promises
// after a crash is chosen with `durability` (see Durability below and docs/sqlite.md).
//
// Thread-safety: a plain value; copy it freely.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "idem/clock.hpp"

namespace idem::sqlite {

// What a committed write survives (PRAGMA synchronous, with the database in WAL mode).
enum class Durability {
  // synchronous=FULL: the WAL is fsync'ed at every commit. A write that returned survives a
  // process crash, an OS crash and a power loss (as far as the disk honours fsync). Slowest.
  full,
  // synchronous=NORMAL (the default): the WAL is fsync'ed only at checkpoints. A write that
  // returned survives a process crash (SIGKILL included); an OS crash or power loss may roll
  // back the last commits, but the database stays consistent (never corrupt).
  normal,
  // synchronous=OFF: no fsync at all. A write that returned survives a process crash; an OS
  // crash or power loss may lose recent commits AND may corrupt the database file. For tests
  // and throwaway data only.
  off,
};

struct SqliteOptions {
  // Wall time for marker timestamps and lease deadlines. Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock;

  // How long one call waits for a lock held by another connection or process before it throws
  // a retryable StoreError with code store_busy. Must be >= 0; 0 fails at once. Default: 5 s.
  std::chrono::milliseconds busy_timeout = std::chrono::seconds(5);

  // What a returned write survives; see Durability. Default: normal.
  Durability durability = Durability::normal;

  // Open the file read-only: reads work, every write throws StoreError(store_read_only), and
  // the schema is never created (it must already exist). Default: false (read-write; the file
  // and the tables are created when missing).
  bool read_only = false;

  // Whether opening may change the file: create it when missing, switch it to WAL and add the
  // tables that are missing. false opens an existing file exactly as it is — its journal mode
  // (an infinity_bus file stays in rollback mode) and its tables (none are added; what needs a
  // missing table fails: on a file with only processed_log a recorder checks, marks, counts,
  // inspects and purges markers, but claims and run_transactional fail with store_error). A
  // missing file is store_open_failed; a file without the component's own table (processed_log,
  // idem_records) is a non-retryable store_error saying the tables do not exist. For
  // maintenance tools (`idem purge`). Default: true.
  bool create_schema = true;

  // Group commit: concurrent mark_processed() calls share one transaction, up to this many
  // marks per commit. Must be >= 1; 1 turns batching off. A mark_processed_many() batch is never
  // split: it commits whole, alone when it is larger than this. Default: 256.
  std::size_t max_batch_size = 256;

  // Idle read-only connections kept for is_processed() (each thread that reads concurrently
  // needs one; extra ones are opened on demand and closed when returned). A ":memory:" database
  // has no readers: it is one connection. Default: 4.
  std::size_t max_idle_readers = 4;
};

}  // namespace idem::sqlite
