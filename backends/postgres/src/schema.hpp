// Internal: creating and migrating idem's tables, versioned per component in
// <schema>.schema_version. Not installed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "connection.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres::detail {

// Brings `component` (e.g. "recorder:processed_log,claims") in options.schema to version
// steps.size(): steps[i] is the SQL that takes it from version i to i + 1 (version 0: nothing
// exists yet). All of it runs in one transaction holding an advisory lock on the schema, so
// processes starting at once migrate once and never see half a schema. A schema whose version is
// newer than steps.size() is refused (StoreError, not retryable). With options.create_schema
// false nothing is created: the component must already be at the current version.
void prepare_schema(Connection& connection, const PostgresOptions& options,
                    const std::string& component, const std::vector<std::string>& steps,
                    std::string_view call);
// The same on a connection of `pool`, which is dropped instead of returned when it fails.
void prepare_schema(ConnectionPool& pool, const PostgresOptions& options,
                    const std::string& component, const std::vector<std::string>& steps,
                    std::string_view call);

}  // namespace idem::postgres::detail
