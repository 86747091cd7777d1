// The names idem's PostgreSQL tests use, brought in with
// `using namespace idem::test::postgres_names;` instead of a list of using-declarations in every
// file.
#pragma once

#include <chrono>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_options.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/postgres/postgres_transaction.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"

namespace idem::test::postgres_names {

using idem::Claim;
using idem::ClaimOutcome;
using idem::ErrorCode;
using idem::ExecutionReport;
using idem::IdempotencyRecord;
using idem::StoredValue;
using idem::postgres::classify_error;
using idem::postgres::ConnectionPool;
using idem::postgres::PgParam;
using idem::postgres::PostgresError;
using idem::postgres::PostgresIdempotencyRecorder;
using idem::postgres::PostgresIdempotencyStore;
using idem::postgres::PostgresOptions;
using idem::postgres::PostgresTransaction;
using idem::postgres::StatementKind;
using namespace std::chrono_literals;

}  // namespace idem::test::postgres_names
