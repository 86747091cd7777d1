// SqliteError: a failure reported by SQLite, as an idem StoreError.
//
// Every SQLite result code idem meets is mapped in one place (sqlite_error.cpp) to an idem
// ErrorCode and the two flags retry logic reads:
//
//   SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL   store_busy            retryable
//   SQLITE_READONLY                               store_read_only
//   SQLITE_READONLY_DBMOVED (extended)            store_replaced
//   SQLITE_NOTADB                                 store_not_a_database
//   SQLITE_CORRUPT                                store_corrupt
//   SQLITE_CANTOPEN                               store_open_failed
//   SQLITE_IOERR, SQLITE_FULL, SQLITE_NOMEM,      store_error           retryable
//   SQLITE_INTERRUPT
//   anything else (SQL errors, constraints, ...)  store_error
//
// A failure of COMMIT is special: BUSY/LOCKED at COMMIT leave the transaction uncommitted (idem
// rolls it back: retryable, not in doubt). So does a full disk or a failed write (SQLITE_FULL,
// SQLITE_IOERR_WRITE) after which SQLite reports the transaction rolled back
// (sqlite3_get_autocommit): the commit record never reached the file, so the outcome is known
// (not committed; retryable, not in doubt). Any other COMMIT failure (a failed fsync, ...) may or
// may not have reached the disk, so it is reported with in_doubt() == true and
// retryable() == false.
//
// Besides SQLite's codes, a write on a file that was deleted or replaced while open is refused
// before it starts, and before its COMMIT, with store_replaced (not retryable, not in doubt:
// nothing of that call was written; SQLite codes SQLITE_READONLY / SQLITE_READONLY_DBMOVED).
//
// The message names what was being done, the database path, SQLite's own message and both the
// primary and the extended result code, e.g.
//   "idem: store_busy: BEGIN IMMEDIATE on '/var/lib/app/idem.db': database is locked
//    (SQLITE_BUSY, extended code 5)"
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem::sqlite {

class SqliteError : public StoreError {
 public:
  SqliteError(ErrorCode code, const std::string& message, int sqlite_code, int extended_code,
              bool retryable, bool in_doubt)
      : StoreError(code, message, retryable, in_doubt),
        sqlite_code_(sqlite_code),
        extended_code_(extended_code) {}

  // The primary result code (SQLITE_BUSY = 5, ...).
  int sqlite_code() const noexcept { return sqlite_code_; }
  // The extended result code (SQLITE_BUSY_SNAPSHOT = 517, ...); equals sqlite_code() when SQLite
  // gave no extended code.
  int extended_code() const noexcept { return extended_code_; }

 private:
  int sqlite_code_;
  int extended_code_;
};

// The name of a primary SQLite result code ("SQLITE_BUSY"); "SQLITE_UNKNOWN(n)" when unknown.
std::string sqlite_code_name(int code);

}  // namespace idem::sqlite
