// The one place where SQLite result codes become idem errors.
#include "idem/sqlite/sqlite_error.hpp"

#include <sqlite3.h>

#include <string>

#include "connection.hpp"

namespace idem::sqlite {

std::string sqlite_code_name(int code) {
  switch (code & 0xff) {
    case SQLITE_OK:
      return "SQLITE_OK";
    case SQLITE_ERROR:
      return "SQLITE_ERROR";
    case SQLITE_INTERNAL:
      return "SQLITE_INTERNAL";
    case SQLITE_PERM:
      return "SQLITE_PERM";
    case SQLITE_ABORT:
      return "SQLITE_ABORT";
    case SQLITE_BUSY:
      return "SQLITE_BUSY";
    case SQLITE_LOCKED:
      return "SQLITE_LOCKED";
    case SQLITE_NOMEM:
      return "SQLITE_NOMEM";
    case SQLITE_READONLY:
      return "SQLITE_READONLY";
    case SQLITE_INTERRUPT:
      return "SQLITE_INTERRUPT";
    case SQLITE_IOERR:
      return "SQLITE_IOERR";
    case SQLITE_CORRUPT:
      return "SQLITE_CORRUPT";
    case SQLITE_NOTFOUND:
      return "SQLITE_NOTFOUND";
    case SQLITE_FULL:
      return "SQLITE_FULL";
    case SQLITE_CANTOPEN:
      return "SQLITE_CANTOPEN";
    case SQLITE_PROTOCOL:
      return "SQLITE_PROTOCOL";
    case SQLITE_EMPTY:
      return "SQLITE_EMPTY";
    case SQLITE_SCHEMA:
      return "SQLITE_SCHEMA";
    case SQLITE_TOOBIG:
      return "SQLITE_TOOBIG";
    case SQLITE_CONSTRAINT:
      return "SQLITE_CONSTRAINT";
    case SQLITE_MISMATCH:
      return "SQLITE_MISMATCH";
    case SQLITE_MISUSE:
      return "SQLITE_MISUSE";
    case SQLITE_NOLFS:
      return "SQLITE_NOLFS";
    case SQLITE_AUTH:
      return "SQLITE_AUTH";
    case SQLITE_FORMAT:
      return "SQLITE_FORMAT";
    case SQLITE_RANGE:
      return "SQLITE_RANGE";
    case SQLITE_NOTADB:
      return "SQLITE_NOTADB";
    case SQLITE_NOTICE:
      return "SQLITE_NOTICE";
    case SQLITE_WARNING:
      return "SQLITE_WARNING";
    case SQLITE_ROW:
      return "SQLITE_ROW";
    case SQLITE_DONE:
      return "SQLITE_DONE";
    default:
      return "SQLITE_UNKNOWN(" + std::to_string(code & 0xff) + ")";
  }
}

namespace detail {

namespace {

struct Mapping {
  ErrorCode code;
  bool retryable;
};

// COMMIT failures after which the transaction can never commit later: SQLite returns them from
// writing the transaction's pages (the WAL frames, the last of which is the commit record; in
// rollback mode the journal, or database pages the hot journal undoes), before anything made it
// durable, and it has then rolled back. Every other COMMIT failure may come after the commit
// record was written — a failed fsync of a fully written WAL, a failed wal-index update after
// it — and WAL recovery can still find that record (SQLite's in-memory rollback notwithstanding),
// so those stay in doubt even when autocommit is back on.
bool fails_before_the_commit_record(int extended) {
  return (extended & 0xff) == SQLITE_FULL || extended == SQLITE_IOERR_WRITE;
}

Mapping map_primary(int primary) {
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:  // a WAL lock race SQLite gave up on: the same as busy for callers
      return {ErrorCode::store_busy, true};
    case SQLITE_READONLY:
      return {ErrorCode::store_read_only, false};
    case SQLITE_NOTADB:
      return {ErrorCode::store_not_a_database, false};
    case SQLITE_CORRUPT:  // a damaged page: the same call fails again until the file is repaired
      return {ErrorCode::store_corrupt, false};
    case SQLITE_CANTOPEN:
      return {ErrorCode::store_open_failed, false};
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_INTERRUPT:
      return {ErrorCode::store_error, true};
    default:
      return {ErrorCode::store_error, false};
  }
}

}  // namespace

SqliteError make_sqlite_error(sqlite3* db, int rc, std::string_view action, std::string_view path,
                              Phase phase) {
  // With SQLITE_OPEN_EXRESCODE every code we see is extended; the low byte is the primary.
  const int primary = rc & 0xff;
  const int extended = (db != nullptr) ? sqlite3_extended_errcode(db) : rc;
  const int extended_code = ((extended & 0xff) == primary) ? extended : rc;
  Mapping mapping = map_primary(primary);
  // SQLite refuses to write a rollback-journal file that was deleted or renamed since it was
  // opened (WAL files are checked by idem: Connection::check_file_not_replaced).
  if (extended_code == SQLITE_READONLY_DBMOVED) mapping = {ErrorCode::store_replaced, false};
  bool in_doubt = false;
  if (phase == Phase::commit && mapping.code != ErrorCode::store_busy) {
    // Known not committed only when SQLite has rolled the transaction back (autocommit is on
    // again) AND the failure came before the commit record could reach the file. Otherwise the
    // caller must not assume either outcome.
    const bool rolled_back = db != nullptr && sqlite3_get_autocommit(db) != 0;
    if (!rolled_back || !fails_before_the_commit_record(extended_code)) {
      in_doubt = true;
      mapping.retryable = false;
    }
  }
  std::string message(action);
  message += " on '";
  message += path;
  message += "': ";
  message += (db != nullptr) ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  message +=
      " (" + sqlite_code_name(primary) + ", extended code " + std::to_string(extended_code) + ")";
  if (in_doubt) {
    message += "; the commit's outcome is unknown";
  } else if (phase == Phase::commit && mapping.code != ErrorCode::store_busy) {
    message += "; SQLite rolled the transaction back: nothing was committed";
  }
  return SqliteError(mapping.code, message, primary, extended_code, mapping.retryable, in_doubt);
}

void throw_sqlite_error(sqlite3* db, int rc, std::string_view action, std::string_view path,
                        Phase phase) {
  throw make_sqlite_error(db, rc, action, path, phase);
}

}  // namespace detail
}  // namespace idem::sqlite
