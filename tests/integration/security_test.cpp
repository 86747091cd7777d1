// Security of idem's backends:
//   * consumer names, event ids and idempotency keys full of SQL, Lua and shell syntax (quotes,
//     semicolons, comments, "); DROP TABLE x; --", '%', '\', "]] end", Redis hash-tag braces)
//     round-trip as plain data on every backend and change nothing else: the statements are
//     prepared with parameters and Redis keys are passed as arguments, never built into code;
//   * control characters (NUL included) are refused with a clean InvalidKey before anything is
//     written, as is a key one byte over kMaxKeyLength;
//   * stored result bytes that look like SQL / Lua / shell come back byte for byte, never run;
//   * a connection failure for a URL with a password (redis://, postgresql://, amqp://) never
//     shows the password in what();
//   * a PostgreSQL schema name that is not a plain identifier is refused with ConfigError.
// SQLite always runs; Redis and PostgreSQL run when their servers are configured
// (IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL), else skip — or fail with IDEM_REQUIRE_SERVERS=1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/recorder.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "redis_test_env.hpp"

namespace {

using namespace std::chrono_literals;
using namespace std::string_literals;

// Every special character idem's key rules allow, in the shapes injection uses.
std::vector<std::string> hostile_keys() {
  return {
      "it's",
      "say \"hi\"",
      "a;b",
      "x -- comment",
      "'); DROP TABLE x; --",
      "'); DROP TABLE processed_log; --",
      "\"; DELETE FROM idem_records; --",
      "100%_%",
      "back\\slash\\",
      "]] end redis.call('FLUSHALL') --[[",
      "{tag}:with:colons:",
      "}{",
      "*?[a-z]",
      "$(rm -rf /) `id` | cat",
      "  padded  ",
      "caf\xc3\xa9 \xe2\x9c\x93",
  };
}

// Not UTF-8: SQLite and Redis keep it as bytes; PostgreSQL keeps keys as text and refuses it
// with InvalidKey (docs/postgres.md).
const std::string kNotUtf8 = "\xff\xfe not utf-8";

std::vector<std::string> keys_for(bool utf8_only) {
  std::vector<std::string> keys = hostile_keys();
  if (!utf8_only) keys.push_back(kNotUtf8);
  return keys;
}

// Refused by validate_key: control characters, NUL included.
std::vector<std::string> refused_keys() {
  return {"nul\0inside"s,
          "\0"s,
          "tab\there",
          "new\nline",
          "del\x7f",
          std::string(idem::kMaxKeyLength + 1, 'k'),
          "",
          "   "};
}

// Result bytes that look like code.
std::vector<std::string> hostile_values() {
  return {
      "'); DROP TABLE idem_records; --",
      "return redis.call('FLUSHALL')",
      "#!/bin/sh\nrm -rf / $(reboot)",
      "\0binary\0with\0nuls\xff"s,
      "",
  };
}

std::string printable(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f) {
      static const char* const kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

template <class Fn>
void expect_invalid_key(Fn&& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "accepted " << printable(what);
  } catch (const idem::InvalidKey& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::invalid_key);
    EXPECT_FALSE(e.retryable());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InvalidKey for " << printable(what) << ": " << e.what();
  }
}

// Every hostile key round-trips on `recorder` as consumer and as event id, and a sentinel
// marker of another consumer is untouched.
void check_recorder(idem::IdempotencyRecorder& recorder, bool utf8_only) {
  recorder.mark_processed("sentinel", "kept");
  for (const std::string& key : keys_for(utf8_only)) {
    SCOPED_TRACE(printable(key));
    EXPECT_FALSE(recorder.is_processed(key, key));
    recorder.mark_processed(key, key);
    EXPECT_TRUE(recorder.is_processed(key, key));
    EXPECT_FALSE(recorder.is_processed(key, key + "x"));
    EXPECT_FALSE(recorder.is_processed(key + "x", key));
    if (recorder.supports_claims()) {
      const idem::Claim claim = recorder.claim("claims", key, 30s);
      ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
      EXPECT_EQ(recorder.claim("claims", key, 30s).status, idem::Claim::Status::in_progress);
      EXPECT_TRUE(recorder.complete("claims", key, claim.token));
      EXPECT_TRUE(recorder.is_processed("claims", key));
    }
  }
  // Keys that differ only in escaped characters stay distinct (escaping is injective).
  recorder.mark_processed("a\\:b", "e");
  EXPECT_FALSE(recorder.is_processed("a:b", "e"));
  EXPECT_FALSE(recorder.is_processed("a\\b", "e"));
  EXPECT_FALSE(recorder.is_processed("a\\", ":b"));
  EXPECT_TRUE(recorder.is_processed("sentinel", "kept"));
  EXPECT_FALSE(recorder.is_processed("sentinel", "other"));

  std::vector<std::string> refused = refused_keys();
  if (utf8_only) refused.push_back(kNotUtf8);
  for (const std::string& bad : refused) {
    expect_invalid_key([&] { recorder.mark_processed("consumer", bad); }, bad);
    expect_invalid_key([&] { recorder.mark_processed(bad, "event"); }, bad);
    expect_invalid_key([&] { (void)recorder.is_processed("consumer", bad); }, bad);
    if (recorder.supports_claims()) {
      expect_invalid_key([&] { (void)recorder.claim("consumer", bad, 30s); }, bad);
    }
  }
  // The longest allowed key works; nothing refused was written.
  const std::string longest(idem::kMaxKeyLength, 'k');
  recorder.mark_processed(longest, longest);
  EXPECT_TRUE(recorder.is_processed(longest, longest));
  EXPECT_FALSE(recorder.is_processed("consumer", "nul"));
  EXPECT_FALSE(recorder.is_processed("consumer", "event"));
}

void check_store(idem::IdempotencyStore& store, bool utf8_only) {
  idem::StoredValue sentinel_value;
  sentinel_value.bytes = "sentinel";
  const auto sentinel = store.claim("sentinel", std::nullopt, 30s);
  ASSERT_EQ(sentinel.status, idem::ClaimOutcome::Status::acquired);
  ASSERT_TRUE(store.complete("sentinel", sentinel.token, sentinel_value, {}, 1h));

  const std::vector<std::string> values = hostile_values();
  std::size_t i = 0;
  for (const std::string& key : keys_for(utf8_only)) {
    SCOPED_TRACE(printable(key));
    const std::string& bytes = values[i++ % values.size()];
    const auto claim = store.claim(key, std::string_view(key), 30s);  // fingerprint = key too
    ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
    idem::StoredValue value;
    value.bytes = bytes;
    ASSERT_TRUE(store.complete(key, claim.token, value, {}, 1h));
    const auto record = store.lookup(key);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->key, key);
    EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
    ASSERT_TRUE(record->value.bytes.has_value());
    EXPECT_EQ(*record->value.bytes, bytes) << printable(*record->value.bytes);
    EXPECT_EQ(record->fingerprint, std::optional<std::string>(key));
    const auto again = store.claim(key, std::string_view(key), 30s);
    EXPECT_EQ(again.status, idem::ClaimOutcome::Status::completed);
    EXPECT_FALSE(store.lookup(key + "x").has_value());
  }
  for (const std::string& bytes : hostile_values()) {  // every value on one key each
    const std::string key = "value-" + std::to_string(i++);
    const auto claim = store.claim(key, std::nullopt, 30s);
    idem::StoredValue value;
    value.bytes = bytes;
    ASSERT_TRUE(store.complete(key, claim.token, value, {}, 1h));
    const auto record = store.lookup(key);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->value.bytes, std::optional<std::string>(bytes)) << printable(bytes);
  }
  const auto kept = store.lookup("sentinel");
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->value.bytes, std::optional<std::string>("sentinel"));

  std::vector<std::string> refused = refused_keys();
  if (utf8_only) refused.push_back(kNotUtf8);
  for (const std::string& bad : refused) {
    expect_invalid_key([&] { (void)store.claim(bad, std::nullopt, 30s); }, bad);
    expect_invalid_key([&] { (void)store.lookup(bad); }, bad);
  }
  const std::string longest(idem::kMaxKeyLength, 'k');
  EXPECT_EQ(store.claim(longest, std::nullopt, 30s).status, idem::ClaimOutcome::Status::acquired);
}

using idem::test::TempDir;

std::vector<std::string> sqlite_tables(const std::string& path) {
  return idem::test::RawDb(path, idem::test::RawDb::kReadOnly)
      .column("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
}

// ---- SQLite ------------------------------------------------------------------------------------

TEST(SecuritySqlite, HostileKeysAndValuesAreData) {
  TempDir dir;
  const std::string path = dir.file("idem.db");
  {
    idem::sqlite::SqliteIdempotencyRecorder recorder(path);
    idem::sqlite::SqliteIdempotencyStore store(path);
    const std::vector<std::string> before = sqlite_tables(path);
    ASSERT_FALSE(before.empty());
    check_recorder(recorder, /*utf8_only=*/false);
    check_store(store, /*utf8_only=*/false);
    EXPECT_EQ(sqlite_tables(path), before);
  }
  // Reopened: still all there (nothing was executed at write or read time).
  idem::sqlite::SqliteIdempotencyRecorder recorder(path);
  for (const std::string& key : hostile_keys())
    EXPECT_TRUE(recorder.is_processed(key, key));
}

// ---- Redis -------------------------------------------------------------------------------------

class SecurityRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    if (idem::test::redis_url().empty())
      IDEM_SERVER_MISSING("no Redis server: IDEM_TEST_REDIS_URL is not set");
  }
};

TEST_F(SecurityRedis, HostileKeysAndValuesAreData) {
  idem::test::RedisTestPrefix prefix("security");
  idem::redis::RedisIdempotencyRecorder recorder(prefix.options());
  idem::redis::RedisIdempotencyStore store(prefix.options());
  // A key outside our prefix that a FLUSHALL / DEL injection would remove.
  idem::test::RedisTestPrefix other("security-other");
  idem::redis::RedisIdempotencyRecorder neighbour(other.options());
  neighbour.mark_processed("neighbour", "kept");
  check_recorder(recorder, /*utf8_only=*/false);
  check_store(store, /*utf8_only=*/false);
  EXPECT_TRUE(neighbour.is_processed("neighbour", "kept"));
}

TEST(SecurityRedisConfig, PasswordInUrlIsNotInConnectError) {
  idem::redis::RedisOptions options =
      idem::redis::RedisOptions::from_url("redis://user:s3cr3t-Pa55@127.0.0.1:1/0");
  options.connect_timeout = 2s;
  try {
    idem::redis::RedisIdempotencyRecorder recorder(options);
    recorder.mark_processed("c", "e");
    ADD_FAILURE() << "connected to port 1";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
  }
  // A bad URL names the problem without the password, too.
  try {
    (void)idem::redis::RedisOptions::from_url("redis://user:s3cr3t-Pa55@127.0.0.1:notaport/0");
    ADD_FAILURE() << "accepted a bad port";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
  }
}

// ---- PostgreSQL --------------------------------------------------------------------------------

class SecurityPostgres : public ::testing::Test {
 protected:
  void SetUp() override { IDEM_REQUIRE_POSTGRES(); }
};

std::vector<std::string> pg_tables(const std::string& schema) {
  auto conn = idem::test::pg::connect(idem::test::pg::server_url().value());
  const char* params[] = {schema.c_str()};
  std::unique_ptr<PGresult, idem::test::pg::ResultCloser> result(PQexecParams(
      conn.get(),
      "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1", 1,
      nullptr, params, nullptr, nullptr, 0));
  std::vector<std::string> tables;
  for (int row = 0; row < PQntuples(result.get()); ++row) {
    tables.emplace_back(PQgetvalue(result.get(), row, 0));
  }
  return tables;
}

TEST_F(SecurityPostgres, HostileKeysAndValuesAreData) {
  idem::test::pg::TempSchema schema;
  idem::postgres::PostgresIdempotencyRecorder recorder(schema.options());
  idem::postgres::PostgresIdempotencyStore store(schema.options());
  const std::vector<std::string> before = pg_tables(schema.name());
  ASSERT_FALSE(before.empty());
  check_recorder(recorder, /*utf8_only=*/true);
  check_store(store, /*utf8_only=*/true);
  EXPECT_EQ(pg_tables(schema.name()), before);
}

TEST(SecurityPostgresConfig, SchemaAndTableNamesMustBeIdentifiers) {
  for (const std::string& bad :
       {"idem\"; DROP SCHEMA public CASCADE; --"s, "a b"s, "x;y"s, "it's"s, ""s, "a.b"s}) {
    SCOPED_TRACE(bad);
    idem::postgres::PostgresOptions options;
    options.url = idem::test::pg::server_url().value_or("postgresql://idem@127.0.0.1:1/idem");
    options.connect_timeout = 2s;
    for (std::string idem::postgres::PostgresOptions::*field :
         {&idem::postgres::PostgresOptions::schema,
          &idem::postgres::PostgresOptions::processed_log_table,
          &idem::postgres::PostgresOptions::claims_table,
          &idem::postgres::PostgresOptions::records_table}) {
      idem::postgres::PostgresOptions named = options;
      named.*field = bad;
      EXPECT_THROW(idem::postgres::PostgresIdempotencyRecorder{named}, idem::ConfigError);
      EXPECT_THROW(idem::postgres::PostgresIdempotencyStore{named}, idem::ConfigError);
    }
    if (!bad.empty()) {  // empty means "derived from the table name"
      idem::postgres::PostgresOptions named = options;
      named.notify_channel = bad;
      EXPECT_THROW(idem::postgres::PostgresIdempotencyStore{named}, idem::ConfigError);
    }
  }
}

TEST(SecurityPostgresConfig, PasswordInUrlIsNotInConnectError) {
  for (const std::string& url :
       {"postgresql://idem:s3cr3t-Pa55@127.0.0.1:1/idem"s,
        "postgresql://idem@127.0.0.1:1/idem?password=s3cr3t-Pa55"s,
        "host=127.0.0.1 port=1 user=idem password=s3cr3t-Pa55 dbname=idem"s}) {
    SCOPED_TRACE(url);
    idem::postgres::PostgresOptions options;
    options.url = url;
    options.connect_timeout = 2s;
    try {
      idem::postgres::PostgresIdempotencyRecorder recorder(options);
      ADD_FAILURE() << "connected to port 1";
    } catch (const std::exception& e) {
      EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
    }
  }
  // libpq's own message for the failure, which idem quotes: it names host and port only.
  PGconn* raw = PQconnectdb("postgresql://idem:s3cr3t-Pa55@127.0.0.1:1/idem");
  EXPECT_EQ(std::string(PQerrorMessage(raw)).find("s3cr3t"), std::string::npos)
      << PQerrorMessage(raw);
  PQfinish(raw);
}

// ---- RabbitMQ ----------------------------------------------------------------------------------

TEST(SecurityRabbitmq, PasswordInUrlIsNotInConnectError) {
  idem::rabbitmq::ConnectionOptions options =
      idem::rabbitmq::ConnectionOptions::from_url("amqp://app:s3cr3t-Pa55@127.0.0.1:1/");
  try {
    idem::rabbitmq::Publisher publisher(options);
    ADD_FAILURE() << "connected to port 1";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
  }
  try {
    (void)idem::rabbitmq::ConnectionOptions::from_url("amqp://app:s3cr3t-Pa55@127.0.0.1:bad/");
    ADD_FAILURE() << "accepted a bad port";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
  }
}

}  // namespace
