// Opening recorders, idempotency stores and outboxes from a URL.
//
// One string says which backend to use and how to configure it, so a program (or the `idem`
// CLI) can be pointed at memory, SQLite, Redis or PostgreSQL by configuration alone:
//
//   memory://[?shards=N]                              (recorder)
//   memory://[?capacity=N&when_full=reject|evict_oldest_completed&shards=N]   (store)
//   sqlite:///absolute/path.db[?durability=full|normal|off&busy_timeout=5s&...]
//   sqlite:relative/path.db[?...]      sqlite::memory:   (a private in-memory database)
//   redis://[[user]:password@]host[:port][/db][?prefix=app:&pool_size=8&...]
//   postgresql://user[:password]@host[:port]/dbname[?schema=idem&pool_size=8&sslmode=...]
//   postgres://...                     (the same)
//
// docs/urls.md lists every query parameter and its default. The scheme is matched without regard
// to case. Each call opens a NEW object (a new file handle, pool or in-memory map): open once
// and share the result.
//
// Errors (nothing is opened when one is thrown):
//   * ConfigError — the URL is malformed: empty, no or unknown scheme, a host where none belongs,
//     a bad port or path, a fragment (#...), an unknown query parameter or a bad value. The
//     message names the wrong part and quotes the URL with its password replaced by "***"
//     (redact_url); a password is never repeated in any message.
//   * NotSupported — the scheme's backend was not built into this idem (the message names the
//     CMake option that builds it, e.g. IDEM_WITH_REDIS).
//   * the backend's own errors (SqliteError, RedisError, PostgresError — all StoreError) when the
//     file or server cannot be used: a Redis recorder PINGs its server and a PostgreSQL one
//     creates its schema when opened, so an unreachable server fails here, retryable.
//
// Thread-safety: the functions are safe to call from any number of threads; the objects they
// return are as thread-safe as their classes (all of idem's are).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/duration.hpp"  // parse_duration: the durations of every URL
#include "idem/idempotency_store.hpp"
#include "idem/outbox.hpp"
#include "idem/recorder.hpp"

namespace idem {

struct OpenOptions {
  // Wall and steady time for the opened object (markers, leases, expiries). Default (null):
  // idem::system_clock().
  std::shared_ptr<Clock> clock;

  // What opening may create or change, whatever the URL's own parameters say.
  enum class Schema {
    create,     // as the URL says (by default the backend's tables, and SQLite's file)
    look_only,  // nothing: SQLite read-only (a missing file is an error), PostgreSQL without
                // creating or migrating its schema; a face whose tables do not exist fails with
                // a StoreError. For tools that only look (idem stats, inspect, list).
    keep,       // no table created and SQLite's journal mode left as it is (create_schema=false),
                // writes allowed. For tools that change records of faces that exist (idem purge,
                // idem release).
  };
  Schema schema = Schema::create;
};

// An IdempotencyRecorder for `url` (memory, sqlite, redis, postgresql/postgres).
std::shared_ptr<IdempotencyRecorder> open_recorder(std::string_view url,
                                                   const OpenOptions& options = {});

// An IdempotencyStore for `url` (memory, sqlite, redis, postgresql/postgres).
std::shared_ptr<IdempotencyStore> open_store(std::string_view url, const OpenOptions& options = {});

// The outbox (idem/outbox.hpp) in the database at `url` (sqlite, postgresql/postgres): the one a
// transactional handler on open_recorder(url)'s recorder writes its follow-ups to, and a relay
// reads. URLs take the same parameters as open_recorder's. NotSupported, naming the scheme, when
// the backend has no outbox (memory, redis) or the database is private to one connection
// (sqlite::memory:). With OpenOptions::Schema::look_only or keep the table is not created: an
// outbox whose table is missing then fails on first use (SQLite) or here (PostgreSQL) with a
// StoreError.
std::shared_ptr<Outbox> open_outbox(std::string_view url, const OpenOptions& options = {});

// `url` with secrets replaced by "***": the password of the user info ("redis://:***@host",
// "postgresql://app:***@db/orders") and the value of a `password` query parameter. Control
// characters are shown as \xNN and text past 256 characters is cut ("..."), so the result is
// safe to print and log. Never throws for any input.
std::string redact_url(std::string_view url);

}  // namespace idem
