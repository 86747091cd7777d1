#include "schema.hpp"

#include <charconv>
#include <cstring>
#include <optional>
#include <string>

#include "idem/error.hpp"
#include "pool_access.hpp"

namespace idem::postgres::detail {

namespace {

std::optional<int> read_version(Connection& connection, const std::string& schema,
                                const std::string& component, std::string_view call) {
  Params params;
  params.text(component);
  const Result result = connection.exec_params(
      "SELECT version FROM " + schema + ".schema_version WHERE component = $1", params, call,
      StatementKind::read);
  if (result.rows() == 0 || result.is_null(0, 0)) return std::nullopt;
  const char* text = PQgetvalue(result.get(), 0, 0);
  int version = 0;
  const auto [end, ec] = std::from_chars(text, text + std::strlen(text), version);
  if (ec != std::errc() || *end != '\0') {
    throw StoreError(ErrorCode::store_corrupt_record,
                     schema + ".schema_version holds '" + std::string(text).substr(0, 32) +
                         "' for " + component + ", not a version number");
  }
  return version;
}

[[noreturn]] void throw_too_new(const std::string& schema, const std::string& component, int found,
                                std::size_t known) {
  throw StoreError("the tables of " + component + " in schema " + schema + " are at version " +
                   std::to_string(found) + ", newer than the version " + std::to_string(known) +
                   " this idem knows; upgrade idem (or use another schema)");
}

}  // namespace

void prepare_schema(Connection& connection, const PostgresOptions& options,
                    const std::string& component, const std::vector<std::string>& steps,
                    std::string_view call) {
  const std::string schema = quote_identifier(options.schema);
  const int target = static_cast<int>(steps.size());
  if (!options.create_schema) {
    std::optional<int> version;
    try {
      version = read_version(connection, schema, component, call);
    } catch (const PostgresError& e) {
      // 3F000: no such schema; 42P01: no schema_version table.
      if (e.sqlstate() != "3F000" && e.sqlstate() != "42P01") throw;
    }
    if (!version) {
      throw StoreError("the tables of " + component + " do not exist in schema " + schema +
                       " and PostgresOptions::create_schema is false");
    }
    if (*version > target) throw_too_new(schema, component, *version, steps.size());
    if (*version < target) {
      throw StoreError("the tables of " + component + " in schema " + schema + " are at version " +
                       std::to_string(*version) + ", older than " + std::to_string(target) +
                       ", and PostgresOptions::create_schema is false (nothing is migrated)");
    }
    return;
  }

  connection.exec("BEGIN", call, StatementKind::read);
  try {
    Params lock;
    lock.text("idem schema " + options.schema);
    connection.exec_params("SELECT pg_advisory_xact_lock(hashtext($1))", lock, call,
                           StatementKind::read);
    connection.exec("CREATE SCHEMA IF NOT EXISTS " + schema + "; CREATE TABLE IF NOT EXISTS " +
                        schema +
                        ".schema_version (component text PRIMARY KEY, version integer NOT NULL, "
                        "migrated_at timestamptz NOT NULL DEFAULT now())",
                    call, StatementKind::read);
    const int found = read_version(connection, schema, component, call).value_or(0);
    if (found > target) throw_too_new(schema, component, found, steps.size());
    for (int version = found; version < target; ++version) {
      connection.exec(steps[static_cast<std::size_t>(version)], call, StatementKind::read);
    }
    if (found != target) {
      Params upsert;
      upsert.text(component).int8(target);
      connection.exec_params("INSERT INTO " + schema +
                                 ".schema_version (component, version) VALUES ($1, $2) "
                                 "ON CONFLICT (component) DO UPDATE SET version = "
                                 "excluded.version, migrated_at = now()",
                             upsert, call, StatementKind::read);
    }
    connection.exec("COMMIT", call, StatementKind::commit);
  } catch (...) {
    if (PQtransactionStatus(connection.raw()) != PQTRANS_IDLE) {
      PQclear(PQexec(connection.raw(), "ROLLBACK"));
    }
    throw;
  }
}

void prepare_schema(ConnectionPool& pool, const PostgresOptions& options,
                    const std::string& component, const std::vector<std::string>& steps,
                    std::string_view call) {
  ConnectionPool::Lease lease = pool.acquire();
  try {
    prepare_schema(detail::PoolAccess::connection(lease), options, component, steps, call);
  } catch (...) {
    lease.mark_broken();
    throw;
  }
}

}  // namespace idem::postgres::detail
