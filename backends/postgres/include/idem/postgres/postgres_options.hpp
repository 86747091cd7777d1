// Options for idem's PostgreSQL backend.
//
// One PostgresOptions describes where the database is (`url`), how the connection pool behaves,
// and where idem keeps its tables (`schema` and the table names). The recorder and the store
// read the same struct; they can share one pool (ConnectionPool) or each open their own.
//
// Time: every instant idem stores (marker timestamps, lease deadlines, completion and expiry
// times) comes from `clock` and is sent to the server as a parameter — the server's own now()
// is never used — so tests can move time with a ManualClock, and every process sharing the
// database must have a reasonably synchronised wall clock (as with any lease).
//
// Thread-safety: a plain value; copy it freely.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "idem/clock.hpp"

namespace idem::postgres {

// How PostgresIdempotencyStore::wait() learns that a key in progress in another process
// finished.
enum class WaitStrategy {
  // LISTEN on `notify_channel`: complete() and release() send NOTIFY with the key as payload
  // when a waiter's listener has asked for it (an advisory lock, see postgres_store.hpp), and a
  // waiter blocks until the notification for its key arrives (re-reading the record every
  // `wait_recheck_interval` as a safety net, and polling while the listener is reconnecting).
  notify,
  // Poll lookup() with capped exponential backoff (2 ms doubling up to 200 ms). No listener
  // connection; for servers behind poolers that do not pass LISTEN/NOTIFY through (PgBouncer in
  // transaction mode).
  poll,
};

struct PostgresOptions {
  // Where the database is: a URL "postgresql://user[:password]@host[:port]/dbname[?param=value]"
  // ("postgres://" too) or a libpq key/value string "host=... port=... dbname=...". Required.
  // Parsed by libpq; a value libpq rejects, another URL scheme or a non-numeric port throws
  // ConfigError. Passwords never appear in idem's error messages; keep them out of the URL with
  // password_file / password_env below. Default: empty (an error).
  std::string url;

  // The most connections the pool opens. Connections are opened on demand and kept for reuse.
  // Must be >= 1. Default: 8.
  std::size_t pool_size = 8;

  // How long opening one connection may take before it fails with a retryable PostgresError.
  // Must be > 0. Default: 5 s.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(5);

  // How long a call waits for a free connection when all pool_size are in use, before it throws
  // a retryable PostgresError (code store_busy). Must be >= 0 (0: fail at once). Default: 5 s.
  std::chrono::milliseconds acquire_timeout = std::chrono::seconds(5);

  // The server-side statement_timeout set on every connection idem opens: a statement running
  // longer is cancelled and throws a retryable PostgresError (SQLSTATE 57014, code timeout).
  // Applies to the statements a transactional handler runs, too. Must be >= 0; 0 means no
  // limit. Default: 30 s.
  std::chrono::milliseconds statement_timeout = std::chrono::seconds(30);

  // The schema holding idem's tables; created when missing (see create_schema). An identifier:
  // ASCII letters, digits and '_', not starting with a digit, at most 63 bytes (ConfigError
  // otherwise). Default: "idem".
  std::string schema = "idem";

  // Recorder: the markers table, (consumer, event_id, ts timestamptz). Same identifier rules.
  // Default: "processed_log".
  std::string processed_log_table = "processed_log";

  // Recorder: the claims table (exclusive mode and the transactional inbox's fence). Same
  // identifier rules. Default: "claims".
  std::string claims_table = "claims";

  // Store: the idempotency records table, one row per key. Same identifier rules.
  // Default: "records".
  std::string records_table = "records";

  // Store: the LISTEN/NOTIFY channel complete() and release() notify, with the key as payload.
  // Same identifier rules. Empty means "<schema>_<records_table>", so stores in different
  // schemas of one database do not wake each other. Default: empty ("idem_records").
  std::string notify_channel;

  // Store: how wait() learns that another process finished a key. Default: notify.
  WaitStrategy wait_strategy = WaitStrategy::notify;

  // Store, notify strategy: a waiter re-reads the record at least this often even without a
  // notification (a safety net against a lost notification). Must be > 0. Default: 1 s.
  std::chrono::milliseconds wait_recheck_interval = std::chrono::seconds(1);

  // Create the schema and tables when missing, and migrate older versions of them, at
  // construction (under an advisory lock, so processes starting together do it once). When
  // false, the tables must already exist at the current version (StoreError otherwise).
  // Default: true.
  bool create_schema = true;

  // Wall time for markers, leases and expiries; steady time for wait() deadlines.
  // Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock;

  // Reported to the server as application_name unless the URL sets one. Default: "idem".
  std::string application_name = "idem";

  // ---- TLS (docs/postgres.md, "TLS and authentication") -------------------------------------
  // Each one given here overrides the URL's parameter of the same name; empty leaves the URL's
  // (or libpq's default) in place. Production: sslmode = "verify-full" with sslrootcert, so
  // the server must show a certificate signed by that CA for the host name connected to.
  // A TLS failure (untrusted or expired certificate, host name mismatch, a server without TLS,
  // an unreadable key) is a non-retryable PostgresError, code store_open_failed, whose message
  // starts "TLS: " and names the cause.

  // disable, allow, prefer, require, verify-ca or verify-full (ConfigError otherwise).
  std::string sslmode;
  // The CA certificate(s) the server's chain must lead to (PEM file).
  std::string sslrootcert;
  // A client certificate and its private key (PEM files), for servers that require one
  // (pg_hba clientcert=verify-full, or the cert method).
  std::string sslcert;
  std::string sslkey;

  // ---- secrets: given inline, from a file or from an environment variable ------------------
  // At most one of each triple (ConfigError otherwise); they override a password in the URL.
  // A file is read at every connect (rotation needs no restart): its content minus one trailing
  // newline. Unreadable or empty: ConfigError at construction, store_open_failed on a later
  // connect. Never printed.
  std::string password;
  std::string password_file;
  std::string password_env;
  // The passphrase of an encrypted sslkey.
  std::string sslpassword;
  std::string sslpassword_file;
  std::string sslpassword_env;
};

}  // namespace idem::postgres
