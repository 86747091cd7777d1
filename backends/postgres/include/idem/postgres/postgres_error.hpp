// PostgresError: a failure reported by PostgreSQL or libpq, as an idem StoreError.
//
// Every failure idem meets is classified in one place (postgres_error.cpp) by its SQLSTATE and
// by what the statement was doing (StatementKind). retryable() means the same call may succeed
// later; in_doubt() means a write may have been committed although the call failed.
//
//   SQLSTATE                                    code                  retryable  notes
//   40001 serialization, 40P01 deadlock,        store_busy            yes
//   55P03 lock not available
//   53300 too many connections                  store_busy            yes
//   57014 query canceled (statement_timeout)    timeout               yes
//   08xxx connection exception,                 store_error           yes        in doubt for a
//   57P01/57P02/57P03 server shutting down,                                      write or COMMIT
//   connection lost (no SQLSTATE)
//   53xxx insufficient resources (disk, memory) store_error           yes
//   28xxx authentication, 3D000 no database,    store_open_failed     no
//   42501 insufficient privilege
//   22xxx data exception                        invalid_argument      no
//   23xxx integrity (23505 unique, 23503 fk)    store_error           no
//   25006 read-only transaction                 store_read_only       yes        the connection
//   (a standby, or a server set read-only)                                       is dropped
//   anything else                               store_error           no
//
// In doubt: a COMMIT — or a single-statement (autocommit) write — whose connection broke, or
// that the server aborted by shutting down, may have committed before the answer was lost. Such
// an error has in_doubt() == true; for a COMMIT retryable() is then false (do not re-run the
// transaction blindly), for an autocommit write of idem's own (a marker, a claim, a complete,
// all keyed and fenced, so re-running is safe) retryable() stays true. A failure reported by the
// server for a statement that did not commit (a deadlock, a statement timeout, a constraint) is
// never in doubt.
//
// Messages name the call, the target without credentials ("idem@127.0.0.1:5432/app"), the
// server's message and the SQLSTATE, e.g.
//   "PostgresIdempotencyStore::claim on idem@127.0.0.1:5432/app: canceling statement due to
//    statement timeout (SQLSTATE 57014)"
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem::postgres {

// What the failing statement was doing; decides in_doubt().
enum class StatementKind {
  read,    // changes nothing (or runs inside an open transaction that is not committed yet)
  write,   // a single statement that commits on its own (autocommit)
  commit,  // COMMIT of an explicit transaction
};

class PostgresError : public StoreError {
 public:
  PostgresError(ErrorCode code, const std::string& message, std::string sqlstate, bool retryable,
                bool in_doubt)
      : StoreError(code, message, retryable, in_doubt), sqlstate_(std::move(sqlstate)) {}

  // The five-character SQLSTATE the server reported ("40001"); empty when the failure came from
  // the client side (connection lost, could not connect, pool exhausted).
  const std::string& sqlstate() const noexcept { return sqlstate_; }

 private:
  std::string sqlstate_;
};

// How a failure is classified (the table above). `sqlstate` may be empty; `connection_lost`
// says the connection is unusable afterwards.
struct ErrorClass {
  ErrorCode code = ErrorCode::store_error;
  bool retryable = false;
  bool in_doubt = false;
};
ErrorClass classify_error(std::string_view sqlstate, bool connection_lost,
                          StatementKind kind) noexcept;

}  // namespace idem::postgres
