// Internal RAII over libpq: a connection with a prepared-statement cache, results, binary
// parameters and decoders, and the helpers every PostgreSQL component shares (identifier
// checks, UTF-8 checks, time conversion). Not installed.
//
// Thread-safety: a Connection (and every Result from it) is used by one thread at a time; the
// pool's leases guarantee that.
#pragma once

#include <libpq-fe.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "idem/clock.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_options.hpp"
#include "idem/sql.hpp"

namespace idem::postgres::detail {

// Type OIDs of the built-in types idem binds (pg_type.h is a server header).
inline constexpr Oid kBoolOid = 16;
inline constexpr Oid kByteaOid = 17;
inline constexpr Oid kInt8Oid = 20;
inline constexpr Oid kInt4Oid = 23;
inline constexpr Oid kTextOid = 25;
inline constexpr Oid kFloat8Oid = 701;
inline constexpr Oid kTimestamptzOid = 1184;
inline constexpr Oid kTextArrayOid = 1009;  // text[]

// ---- helpers --------------------------------------------------------------------------------

// Throws ConfigError unless `name` is a plain identifier: [A-Za-z_][A-Za-z0-9_]*, 1..63 bytes.
void check_identifier(std::string_view what, std::string_view name);
// "name" with embedded quotes doubled, for SQL text.
std::string quote_identifier(std::string_view name);

// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool is_utf8(std::string_view text) noexcept;
// The UTF-8 check PostgreSQL text needs (validate_key() is done by the protocol's public calls);
// throws InvalidKey naming `what`.
void require_utf8_key(std::string_view what, std::string_view value);

// Microseconds since 2000-01-01 00:00:00 UTC: PostgreSQL's binary timestamptz.
std::int64_t to_pg_time(WallTime t) noexcept;
WallTime from_pg_time(std::int64_t pg_us) noexcept;
// t + d, saturating at the ends of WallTime's range.
WallTime add_saturating(WallTime t, std::chrono::nanoseconds d) noexcept;

// ---- errors ---------------------------------------------------------------------------------

// The PostgresError for a failed statement (classification in postgres_error.cpp). `result` may
// be null (libpq could not even send the statement).
PostgresError make_error(PGconn* conn, const PGresult* result, std::string_view call,
                         std::string_view target, StatementKind kind);
// True when `result` is the server refusing a write (SQLSTATE 25006): the session is on a
// standby or a read-only server, so it is not reused (a new connection with
// target_session_attrs=read-write finds the primary after a failover).
bool refuses_writes(const PGresult* result) noexcept;
// True when a notice says the session is about to end (severity FATAL or PANIC: the server shuts
// down or terminated it). A connection's notice receiver marks itself doomed on one.
bool ends_session(const PGresult* notice) noexcept;
// Whether an idle session is still usable. An idle session has nothing to read: whatever did
// arrive is read and parsed without blocking (stray notifications are dropped), the FATAL a
// server sends its sessions when it shuts down or terminates one, and then the end of the
// stream. `doomed` is the connection's flag that its notice receiver sets (ends_session); input
// that keeps arriving is not trusted either.
bool idle_session_healthy(PGconn* conn, const bool& doomed) noexcept;
// A client-side failure (no SQLSTATE): could not connect, pool exhausted, ...
PostgresError make_client_error(ErrorCode code, std::string_view call, std::string_view target,
                                std::string_view message, bool retryable);

// ---- results and parameters ---------------------------------------------------------------

struct ResultClear {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};

// A statement's result, in binary format for idem's own statements.
class Result {
 public:
  Result() = default;
  explicit Result(PGresult* r) noexcept : result_(r) {}

  PGresult* get() const noexcept { return result_.get(); }
  int rows() const noexcept { return result_ ? PQntuples(result_.get()) : 0; }
  // Rows changed by an INSERT/UPDATE/DELETE (PQcmdTuples), 0 when none is reported.
  std::int64_t affected() const noexcept;
  // What SqlTransaction::exec reports: the rows a statement changed, or for a query (which
  // reports no count) the rows it returned.
  std::int64_t changed_or_returned() const noexcept;

  bool is_null(int row, int column) const noexcept;
  // Binary decoders; they throw StoreError(store_corrupt_record) when the stored bytes do not
  // have the size of the type (never read past a value).
  std::string_view bytes(int row, int column) const noexcept;
  std::int64_t int8(int row, int column) const;
  std::int32_t int4(int row, int column) const;
  bool boolean(int row, int column) const;
  WallTime timestamptz(int row, int column) const;

 private:
  std::unique_ptr<PGresult, ResultClear> result_;
};

// Parameters for a statement, sent in binary with explicit types. Text and bytes are
// referenced: they must outlive the statement's execution.
class Params {
 public:
  Params& text(std::string_view value);
  // A temporary string is kept by the Params (so `text("a" + b)` is safe).
  Params& text(std::string&& value);
  Params& bytea(std::string_view value);
  Params& int8(std::int64_t value);
  Params& boolean(bool value);
  Params& float8(double value);
  Params& timestamptz(WallTime value);
  // A text[] (one dimension, no NULLs), encoded in binary and kept by the Params.
  Params& text_array(std::span<const std::string> values);
  Params& null(Oid type);
  // Text sent in text format with no type (the server infers it from the statement), copied:
  // for statements written by users (PostgresTransaction::exec).
  Params& untyped(std::string_view text);

  int size() const noexcept { return static_cast<int>(types_.size()); }
  const Oid* types() const noexcept { return types_.data(); }

  // Builds libpq's value/length/format arrays (pointers into this object and the referenced
  // strings).
  struct Arrays {
    std::vector<const char*> values;
    std::vector<int> lengths;
    std::vector<int> formats;
  };
  Arrays arrays() const;

 private:
  struct Slot {
    std::string_view ref;
    std::array<char, 8> inline_bytes{};
    int inline_size = -1;  // >= 0: the value is in inline_bytes
    bool is_null = false;
    int format = 1;  // 1 binary, 0 text
  };
  // (Defined here, inline, so that they stay out of the shared library's symbol table.)
  Params& push(Oid type, const Slot& slot) {
    types_.push_back(type);
    slots_.push_back(slot);
    return *this;
  }
  // An 8-byte binary value (int8, float8, timestamptz): its bytes big-endian.
  Params& push_be64(Oid type, std::uint64_t bits) {
    Slot slot;
    for (int i = 7; i >= 0; --i) {
      slot.inline_bytes[static_cast<std::size_t>(i)] = static_cast<char>(bits & 0xff);
      bits >>= 8;
    }
    slot.inline_size = 8;
    return push(type, slot);
  }

  std::vector<Oid> types_;
  std::vector<Slot> slots_;
  std::deque<std::string> owned_;  // copies for untyped(); a deque keeps them in place
};

// How the server plans a Statement.
enum class Planning {
  // Prepared once per connection (named); after five runs the server may keep one generic plan.
  prepared,
  // Sent unnamed with its parameters every time, so every run is planned for its own parameters
  // and the table as it is now. For statements whose best plan depends on the table's size: a
  // generic plan chosen while the table was tiny (before autovacuum's first ANALYZE) is kept
  // however large it grows — for `consumer = $1 AND event_id = ANY($2)` that was a scan of the
  // consumer's every marker per batch (DESIGN-NOTES §29).
  per_run,
};

// A statement idem prepares on each connection that runs it. The name is derived from the SQL
// text, so recorders and stores with different tables sharing a pool never collide.
struct Statement {
  Statement(std::string sql_text, std::vector<Oid> param_types,
            Planning planning_mode = Planning::prepared);
  std::string name;
  std::string sql;
  std::vector<Oid> types;
  Planning planning = Planning::prepared;
};

// ---- connection -----------------------------------------------------------------------------

// Starts a non-blocking connection attempt for `options` (PQconnectStartParams with idem's
// settings, verbose errors until connected); the caller drives PQconnectPoll. Never null.
// Throws PostgresError (store_open_failed) when a password file or variable cannot be read.
PGconn* connect_start(const PostgresOptions& options, const std::string& target = "the server");
// The PostgresError for a connection attempt that failed with libpq's message `why`. TLS set-up
// failures are store_open_failed, not retryable, "TLS: <cause>"; a host name that does not
// resolve is host_not_found, a refused connection connection_refused, a server that answers
// something else than PostgreSQL wrong_protocol; with `conn` and a budget, an
// unverified certificate's reason is asked of OpenSSL in one short handshake of its own.
PostgresError connect_error(std::string_view why, const std::string& target, PGconn* conn = nullptr,
                            std::chrono::milliseconds verify_budget = std::chrono::milliseconds(0));
// The PostgresError (connect_timeout, retryable) for a connection attempt that took longer than
// options.connect_timeout; with `conn`, it says when the TCP connection was made but nothing
// answered as PostgreSQL does.
PostgresError connect_timeout_error(const PostgresOptions& options, const std::string& target,
                                    PGconn* conn = nullptr);
// A user's statement parameters (AsyncSqlTransaction, PostgresTransaction) as libpq parameters
// in text format, untyped (the server infers the types); InvalidArgument for text with a NUL.
Params to_params(std::span<const SqlParam> params);

// The password and key passphrase a connect sends, from PostgresOptions' inline / _file / _env
// fields (nullopt: none given there; libpq then uses the URL's, PGPASSWORD or ~/.pgpass).
// Throws ConfigError when a file or variable cannot be read, or more than one source is set.
struct ConnectionSecrets {
  std::optional<std::string> password;
  std::optional<std::string> sslpassword;
};
ConnectionSecrets connection_secrets(const PostgresOptions& options);

// What went wrong in a failed TLS set-up, from libpq's message: "" when `message` is not about
// TLS. Used to report it as a non-retryable "TLS: <cause>" error.
std::string tls_failure_cause(std::string_view message);

class Connection {
 public:
  // Opens and configures a connection (statement_timeout, notices silenced). `target` is the
  // credential-free description used in messages. Throws PostgresError (retryable when the
  // server is unreachable or not accepting connections, store_open_failed when it refuses us).
  static std::unique_ptr<Connection> open(const PostgresOptions& options,
                                          const std::string& target);
  ~Connection();

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  PGconn* raw() const noexcept { return conn_; }
  const std::string& target() const noexcept { return target_; }

  // True when the connection is usable and idle: reads whatever the server sent meanwhile
  // without blocking (a server that shut down or terminated the session is noticed here).
  bool healthy() noexcept;
  bool broken() const noexcept;  // lost, or the server ended the session

  // Runs `statement` (prepared on this connection on first use) with binary results. Throws
  // PostgresError on failure, classified by `kind`.
  Result run(const Statement& statement, const Params& params, std::string_view call,
             StatementKind kind);
  // Runs SQL text without parameters (BEGIN, COMMIT, DDL — several statements allowed), text
  // results.
  Result exec(std::string_view sql, std::string_view call, StatementKind kind);
  // Runs one statement with parameters without preparing it (types may be 0: inferred), text
  // results.
  Result exec_params(std::string_view sql, const Params& params, std::string_view call,
                     StatementKind kind);

 private:
  Connection(PGconn* conn, std::string target) noexcept : conn_(conn), target_(std::move(target)) {}
  void check(const Result& result, std::string_view call, StatementKind kind);
  static void on_notice(void* self, const PGresult* notice);

  PGconn* conn_;
  bool doomed_ = false;  // a FATAL arrived, or a write was refused as read-only (25006)
  std::string target_;
  std::unordered_set<std::string> prepared_;
};

}  // namespace idem::postgres::detail
