// Internal: the SQL text of the recorder's and the store's statements, built once from the
// options (schema and table names), shared by the blocking classes (postgres_recorder.cpp,
// postgres_store.cpp) and the coroutine ones (async_postgres_recorder.cpp,
// async_postgres_store.cpp), so both faces run the very same statements on one database. Not
// installed.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "connection.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres::detail {

// Markers deleted per transaction by the recorder's purge(): bounds the transaction's row locks
// and WAL.
inline constexpr int kRecorderPurgeChunkRows = 1000;
// Expired results deleted per transaction by the store's purge_expired().
inline constexpr int kStorePurgeChunkRows = 1000;

// The columns every store statement that reads a record returns, in this order (decode_record).
inline constexpr const char* kRecordColumns =
    "state, token, fingerprint, lease_until, took_over, completed_at, expires_at, value, report";
// The store's claim statement returns (acquired, token, took_over) before them.
inline constexpr int kClaimLeadingColumns = 3;

// A waiter's interest in a store key is a shared advisory lock in the two-int key space (which
// never meets the one-bigint space): this class id first ("idem" in ASCII), then
// hashtext(channel || ':' || key). A hash collision only costs a NOTIFY nobody needed.
inline constexpr std::int32_t kInterestLockClass = 0x6964656d;
// "<function>(<class>, hashtext(<channel> || ':' || <key>))": the SQL that takes, tries or
// releases the interest lock, for the given SQL expressions of the channel and the key.
std::string interest_lock(std::string_view function, std::string_view channel,
                          std::string_view key);

struct RecorderSql {
  explicit RecorderSql(const PostgresOptions& options);

  std::string schema;
  std::string log;
  std::string claims;
  std::string sequence;

  Statement select_marker;
  Statement select_markers_many;
  Statement insert_markers_many;
  Statement insert_marker;
  Statement claim;
  Statement reread;
  Statement complete;
  Statement release;
  Statement renew;
  Statement transactional_mark;
  Statement purge_chunk;
  Statement purge_claims;
  Statement count_old_markers;
  Statement count_markers;
  Statement count_live_claims;
  Statement inspect;
};

struct StoreSql {
  explicit StoreSql(const PostgresOptions& options);

  std::string table;
  std::string table_name;  // unquoted, for messages
  std::string sequence;
  std::string channel;

  Statement claim;
  Statement lookup;
  Statement complete;
  Statement drop;
  Statement lock_interest;
  Statement unlock_interest;
  Statement renew;
  Statement purge_chunk;
  Statement count_by_state;
  Statement count;
  Statement list;    // key, then the record columns (value and report NULL)
  Statement remove;  // as drop, whatever the state
};

}  // namespace idem::postgres::detail
