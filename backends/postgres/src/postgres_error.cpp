// The one place where SQLSTATEs and lost connections become idem errors (table in
// postgres_error.hpp).
#include "idem/postgres/postgres_error.hpp"

namespace idem::postgres {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) noexcept {
  return s.substr(0, prefix.size()) == prefix;
}

// The session ended: the connection is gone, or the server is shutting down or crashed.
bool is_connection_failure(std::string_view sqlstate, bool connection_lost) noexcept {
  return connection_lost || starts_with(sqlstate, "08") || sqlstate == "57P01" ||
         sqlstate == "57P02" || sqlstate == "57P03";
}

}  // namespace

ErrorClass classify_error(std::string_view sqlstate, bool connection_lost,
                          StatementKind kind) noexcept {
  if (is_connection_failure(sqlstate, connection_lost)) {
    // The server may have committed a write just before the session ended (a backend told to
    // shut down after its commit still answers with FATAL instead of CommandComplete).
    if (kind == StatementKind::commit) return {ErrorCode::store_error, false, true};
    if (kind == StatementKind::write) return {ErrorCode::store_error, true, true};
    return {ErrorCode::store_error, true, false};
  }
  if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03" || sqlstate == "53300") {
    return {ErrorCode::store_busy, true, false};
  }
  if (sqlstate == "57014") return {ErrorCode::timeout, true, false};
  if (starts_with(sqlstate, "53")) return {ErrorCode::store_error, true, false};
  if (starts_with(sqlstate, "28") || sqlstate == "3D000" || sqlstate == "42501") {
    return {ErrorCode::store_open_failed, false, false};
  }
  // A server that refuses writes is a standby (a failover moved the primary, or the URL led
  // to the standby) or one switched read-only: the connection is dropped (connection.cpp,
  // async_connection.cpp) and a new one, with target_session_attrs=read-write, finds the
  // primary. The statement was refused, so nothing is in doubt.
  if (sqlstate == "25006") return {ErrorCode::store_read_only, true, false};
  if (starts_with(sqlstate, "22")) return {ErrorCode::invalid_argument, false, false};
  return {ErrorCode::store_error, false, false};
}

}  // namespace idem::postgres
