// Internal: the way out of a transaction on a leased connection. Until disarm() (after COMMIT
// succeeded), destroying the guard rolls the open transaction back; a connection that cannot be
// rolled back (lost, or in an unknown state) is marked broken, so the pool drops it and the
// server rolls back. Shared by the recorder's transactional mark and the outbox relay. Not
// installed.
#pragma once

#include <libpq-fe.h>

#include "idem/postgres/connection_pool.hpp"

namespace idem::postgres::detail {

class RollbackGuard {
 public:
  explicit RollbackGuard(ConnectionPool::Lease& lease) noexcept : lease_(lease) {}
  RollbackGuard(const RollbackGuard&) = delete;
  RollbackGuard& operator=(const RollbackGuard&) = delete;
  ~RollbackGuard() {
    if (!armed_) return;
    PGconn* conn = lease_.get();
    if (PQstatus(conn) != CONNECTION_OK) {
      lease_.mark_broken();
      return;
    }
    if (PQtransactionStatus(conn) == PQTRANS_IDLE) return;
    PGresult* result = PQexec(conn, "ROLLBACK");
    const bool ok = result != nullptr && PQresultStatus(result) == PGRES_COMMAND_OK;
    PQclear(result);
    if (!ok || PQtransactionStatus(conn) != PQTRANS_IDLE) lease_.mark_broken();
  }

  // The transaction committed (or was rolled back on purpose): nothing left to undo.
  void disarm() noexcept { armed_ = false; }

 private:
  ConnectionPool::Lease& lease_;
  bool armed_ = true;
};

}  // namespace idem::postgres::detail
