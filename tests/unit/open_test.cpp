// idem::open_recorder / open_store / redact_url / parse_duration without servers: every scheme
// and query parameter that can be checked locally (memory, SQLite), every kind of bad URL
// (each error names the wrong part and never the password), odd inputs (NUL bytes, control
// characters, very long text, %-escapes, IPv6 hosts, random bytes) that must never crash.
// Opening Redis and PostgreSQL objects for real is in tests/integration/*_open_test.cpp.
#include "idem/open.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>

#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

#if __has_include("idem/sqlite/sqlite_recorder.hpp")
#define IDEM_TEST_HAVE_SQLITE 1
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#endif
#if __has_include("idem/redis/redis_recorder.hpp")
#define IDEM_TEST_HAVE_REDIS 1
#endif
#if __has_include("idem/postgres/postgres_recorder.hpp")
#define IDEM_TEST_HAVE_POSTGRES 1
#endif

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using idem::open_recorder;
using idem::open_store;

// What an open_* call threw: its type and message (or "" when it did not throw).
struct Thrown {
  bool config_error = false;
  bool not_supported = false;
  bool store_error = false;
  bool retryable = false;
  std::string message;
};

template <class Open>
Thrown thrown_by(Open&& open) {
  Thrown t;
  try {
    (void)open();
  } catch (const idem::ConfigError& e) {
    t.config_error = true;
    t.message = e.what();
  } catch (const idem::NotSupported& e) {
    t.not_supported = true;
    t.message = e.what();
  } catch (const idem::StoreError& e) {
    t.store_error = true;
    t.retryable = e.retryable();
    t.message = e.what();
  }
  return t;
}

// Both faces refuse `url` with a ConfigError whose message contains every one of `parts`.
void expect_bad_url(std::string_view url, std::initializer_list<std::string_view> parts) {
  for (const bool store : {false, true}) {
    const Thrown t = store ? thrown_by([&] { return open_store(url); })
                           : thrown_by([&] { return open_recorder(url); });
    EXPECT_TRUE(t.config_error) << (store ? "open_store" : "open_recorder") << "('"
                                << idem::redact_url(url) << "') gave: '" << t.message << "'";
    for (std::string_view part : parts) {
      EXPECT_NE(t.message.find(part), std::string::npos)
          << "'" << t.message << "' does not mention '" << part << "'";
    }
  }
}

using idem::test::TempDir;

// Changes the working directory for one scope (for relative sqlite: paths).
class WorkingDir {
 public:
  explicit WorkingDir(const fs::path& dir) : previous_(fs::current_path()) {
    fs::current_path(dir);
  }
  WorkingDir(const WorkingDir&) = delete;
  WorkingDir& operator=(const WorkingDir&) = delete;
  ~WorkingDir() {
    std::error_code ec;
    fs::current_path(previous_, ec);
  }

 private:
  fs::path previous_;
};

// ---- memory ----------------------------------------------------------------------------------

TEST(OpenMemory, RecorderForEverySpelling) {
  for (const char* url :
       {"memory://", "memory:", "MEMORY://", "Memory:?shards=8", "memory://?shards=1",
        "memory://?shards=3&", "memory://?expected_markers=1000&shards=2"}) {
    auto recorder = open_recorder(url);
    ASSERT_NE(dynamic_cast<idem::InMemoryIdempotencyRecorder*>(recorder.get()), nullptr) << url;
    EXPECT_FALSE(recorder->is_processed("c", "e1"));
    recorder->mark_processed("c", "e1");
    EXPECT_TRUE(recorder->is_processed("c", "e1"));
  }
}

TEST(OpenMemory, EachCallOpensANewObject) {
  auto a = open_recorder("memory://");
  auto b = open_recorder("memory://");
  a->mark_processed("c", "e");
  EXPECT_FALSE(b->is_processed("c", "e"));
}

TEST(OpenMemory, RecorderUsesTheGivenClock) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto recorder = open_recorder("memory://", {.clock = clock});
  constexpr auto kAcquired = idem::Claim::Status::acquired;
  ASSERT_EQ(recorder->claim("c", "e", 1s).status, kAcquired);
  EXPECT_NE(recorder->claim("c", "e", 1s).status, kAcquired);
  clock->advance(1s);  // the lease ends on the injected clock, not the real one
  EXPECT_EQ(recorder->claim("c", "e", 1s).status, kAcquired);
}

TEST(OpenMemory, StoreCapacityAndWhenFull) {
  auto store = open_store("memory://?capacity=1");
  ASSERT_NE(dynamic_cast<idem::InMemoryIdempotencyStore*>(store.get()), nullptr);
  (void)store->claim("k1", std::nullopt, 10s);
  EXPECT_THROW((void)store->claim("k2", std::nullopt, 10s), idem::StoreError);  // reject

  auto evicting = open_store("memory://?capacity=1&when_full=evict_oldest_completed&shards=2");
  const auto first = evicting->claim("k1", std::nullopt, 10s);
  ASSERT_TRUE(evicting->complete("k1", first.token, {}, idem::ExecutionReport{}, 1h));
  EXPECT_NO_THROW((void)evicting->claim("k2", std::nullopt, 10s));  // k1 was evicted
  EXPECT_EQ(evicting->entry_count(), 1u);
}

TEST(OpenMemory, BadParameters) {
  expect_bad_url("memory://?shards=0", {"query parameter 'shards'", "from 1 to 65536", "'0'"});
  expect_bad_url("memory://?shards=1000000000000", {"'shards'", "65536"});
  {
    // A recorder's parameter: the recorder checks its range, the store does not know it.
    const Thrown t =
        thrown_by([] { return open_recorder("memory://?expected_markers=100000000000"); });
    EXPECT_TRUE(t.config_error) << t.message;
    EXPECT_NE(t.message.find("68719476736"), std::string::npos) << t.message;
    EXPECT_TRUE(thrown_by([] { return open_store("memory://?expected_markers=10"); }).config_error);
  }
  expect_bad_url("memory://?shards=-1", {"'shards'"});
  expect_bad_url("memory://?shards=99999999999999999999999", {"'shards'"});
  expect_bad_url("memory://?shards=", {"'shards'"});
  expect_bad_url("memory://?shards", {"'shards'", "no value"});
  expect_bad_url("memory://?shards=2&shards=4", {"'shards'", "twice"});
  expect_bad_url("memory://host", {"host", "memory://"});
  expect_bad_url("memory:somewhere", {"path"});
  expect_bad_url("memory://?=3", {"no name"});
  // The recorder has no capacity; the store has no such thing as "shard".
  EXPECT_TRUE(thrown_by([] { return open_recorder("memory://?capacity=3"); }).config_error);
  const Thrown t = thrown_by([] { return open_store("memory://?shard=3"); });
  EXPECT_TRUE(t.config_error);
  EXPECT_NE(t.message.find("'shard'"), std::string::npos) << t.message;
  EXPECT_NE(t.message.find("capacity, when_full, shards"), std::string::npos) << t.message;
  const Thrown full = thrown_by([] { return open_store("memory://?when_full=drop"); });
  EXPECT_NE(full.message.find("'when_full'"), std::string::npos) << full.message;
  EXPECT_TRUE(thrown_by([] { return open_store("memory://?capacity=0"); }).config_error);
}

// ---- sqlite ----------------------------------------------------------------------------------

#ifdef IDEM_TEST_HAVE_SQLITE
TEST(OpenSqlite, AbsolutePathAndEveryParameter) {
  TempDir dir;
  const std::string path = (dir.path() / "idem.db").string();
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto recorder = open_recorder("SQLite://" + path +
                                    "?durability=full&busy_timeout=250ms&max_batch_size=7&"
                                    "max_idle_readers=0",
                                {.clock = clock});
  auto* sqlite = dynamic_cast<idem::sqlite::SqliteIdempotencyRecorder*>(recorder.get());
  ASSERT_NE(sqlite, nullptr);
  EXPECT_EQ(sqlite->path(), path);
  EXPECT_EQ(sqlite->options().durability, idem::sqlite::Durability::full);
  EXPECT_EQ(sqlite->options().busy_timeout, 250ms);
  EXPECT_EQ(sqlite->options().max_batch_size, 7u);
  EXPECT_EQ(sqlite->options().max_idle_readers, 0u);
  EXPECT_EQ(sqlite->options().clock, clock);
  EXPECT_FALSE(sqlite->options().read_only);
  recorder->mark_processed("c", "e");

  // The store on the same file; read_only on an existing file.
  auto store = open_store("sqlite://" + path + "?durability=off&busy_timeout=2s");
  auto* sqlite_store = dynamic_cast<idem::sqlite::SqliteIdempotencyStore*>(store.get());
  ASSERT_NE(sqlite_store, nullptr);
  EXPECT_EQ(sqlite_store->options().durability, idem::sqlite::Durability::off);
  EXPECT_EQ(sqlite_store->options().busy_timeout, 2s);
  auto reader = open_recorder("sqlite://" + path + "?read_only=true");
  EXPECT_TRUE(reader->is_processed("c", "e"));
  EXPECT_THROW(reader->mark_processed("c", "f"), idem::StoreError);
  auto normal = open_recorder("sqlite:" + path + "?durability=normal&read_only=0");
  EXPECT_EQ(
      dynamic_cast<idem::sqlite::SqliteIdempotencyRecorder*>(normal.get())->options().durability,
      idem::sqlite::Durability::normal);
}

TEST(OpenSqlite, RelativePathInMemoryAndEscapes) {
  TempDir dir;
  {
    WorkingDir cwd(dir.path());
    auto recorder = open_recorder("sqlite:relative/../a.db");
    EXPECT_EQ(dynamic_cast<idem::sqlite::SqliteIdempotencyRecorder*>(recorder.get())->path(),
              "relative/../a.db");
  }
  EXPECT_TRUE(fs::exists(dir.path() / "a.db"));

  const std::string absolute = (dir.path() / "no-authority.db").string();
  auto no_authority = open_recorder("sqlite:" + absolute);
  EXPECT_EQ(dynamic_cast<idem::sqlite::SqliteIdempotencyRecorder*>(no_authority.get())->path(),
            absolute);

  auto memory = open_recorder("sqlite::memory:");
  EXPECT_EQ(dynamic_cast<idem::sqlite::SqliteIdempotencyRecorder*>(memory.get())->path(),
            ":memory:");
  memory->mark_processed("c", "e");
  EXPECT_TRUE(memory->is_processed("c", "e"));
  EXPECT_NO_THROW((void)open_store("sqlite::memory:"));

  const std::string spaced = (dir.path() / "a b#c.db").string();
  auto escaped = open_store("sqlite://" + (dir.path() / "a%20b%23c.db").string());
  EXPECT_EQ(dynamic_cast<idem::sqlite::SqliteIdempotencyStore*>(escaped.get())->path(), spaced);
  EXPECT_TRUE(fs::exists(spaced));
}

TEST(OpenSqlite, BadUrlsNameTheWrongPart) {
  expect_bad_url("sqlite://host/tmp/x.db", {"host", "'host'", "sqlite:///"});
  expect_bad_url("sqlite://", {"path", "missing"});
  expect_bad_url("sqlite:", {"path", "missing"});
  expect_bad_url("sqlite:?durability=full", {"path"});
  expect_bad_url("sqlite:///tmp/x.db?durability=fast", {"'durability'", "full, normal or off"});
  expect_bad_url("sqlite:///tmp/x.db?busy_timeout=5", {"'busy_timeout'", "no unit"});
  expect_bad_url("sqlite:///tmp/x.db?busy_timeout=-5s", {"'busy_timeout'", "negative"});
  expect_bad_url("sqlite:///tmp/x.db?busy_timeout=1001d", {"'busy_timeout'", "1000d"});
  expect_bad_url("sqlite:///tmp/x.db?busy_timeout=9223372036854775807ms", {"1000d"});
  expect_bad_url("sqlite:///tmp/x.db?read_only=yes", {"'read_only'", "true or false"});
  expect_bad_url("sqlite:///tmp/x.db?max_batch_size=0", {"'max_batch_size'"});
  expect_bad_url("sqlite:///tmp/x.db?journal=wal", {"'journal'", "durability, busy_timeout"});
  expect_bad_url("sqlite:///tmp/x.db?durability=full&durability=off", {"twice"});
  expect_bad_url("sqlite:///tmp/a%zz.db", {"path", "%-escape"});
  expect_bad_url("sqlite:///tmp/a%4", {"path", "%-escape"});
  expect_bad_url("sqlite:///tmp/a%00.db", {"path", "NUL"});
  expect_bad_url("sqlite:///tmp/x.db?%zz=1", {"%-escape"});
}

TEST(OpenSqlite, AFileThatCannotBeOpenedIsAStoreError) {
  TempDir dir;
  const Thrown t = thrown_by(
      [&] { return open_recorder("sqlite://" + (dir.path() / "no/such/dir/x.db").string()); });
  EXPECT_TRUE(t.store_error) << t.message;
}
#else
TEST(OpenSqlite, NotBuiltIsNotSupported) {
  const Thrown t = thrown_by([] { return open_recorder("sqlite:///tmp/x.db"); });
  EXPECT_TRUE(t.not_supported);
  EXPECT_NE(t.message.find("IDEM_WITH_SQLITE"), std::string::npos) << t.message;
}
#endif

// ---- open_outbox -------------------------------------------------------------------------------

// A backend without an outbox is refused by name before anything is opened (no server needed).
TEST(OpenOutbox, SchemesWithoutAnOutboxAreNotSupportedByName) {
  for (const std::string_view url :
       {"memory://", "MEMORY:", "redis://127.0.0.1:1/0", "redis://:secret@127.0.0.1:1/0"}) {
    const Thrown t = thrown_by([&] { return idem::open_outbox(url); });
    EXPECT_TRUE(t.not_supported) << url << " gave: '" << t.message << "'";
    const std::string scheme(url.substr(0, url.find(':')));
    std::string lower;
    for (char c : scheme)
      lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    EXPECT_NE(t.message.find(lower), std::string::npos) << t.message;
    EXPECT_EQ(t.message.find("secret"), std::string::npos) << t.message;
  }
}

TEST(OpenOutbox, MalformedUrlsAreConfigErrors) {
  EXPECT_TRUE(thrown_by([] { return idem::open_outbox(""); }).config_error);
  EXPECT_TRUE(thrown_by([] { return idem::open_outbox("nosuch://x"); }).config_error);
#if IDEM_TEST_HAVE_SQLITE
  EXPECT_TRUE(thrown_by([] { return idem::open_outbox("sqlite:x.db?bogus=1"); }).config_error);
#endif
}

#if IDEM_TEST_HAVE_SQLITE
TEST(OpenOutbox, SqliteFileGivesTheOutboxOnThatFile) {
  TempDir dir;
  const std::string path = (dir.path() / "outbox.db").string();
  auto outbox = idem::open_outbox("sqlite://" + path + "?busy_timeout=2s");
  auto* sqlite = dynamic_cast<idem::sqlite::SqliteOutbox*>(outbox.get());
  ASSERT_NE(sqlite, nullptr);
  EXPECT_EQ(sqlite->path(), path);
  EXPECT_EQ(outbox->stats().depth, 0u);
  // The same file as the recorder's: look-only opening finds the table the first one created.
  idem::OpenOptions look;
  look.schema = idem::OpenOptions::Schema::look_only;
  EXPECT_EQ(idem::open_outbox("sqlite://" + path, look)->stats().depth, 0u);
}

TEST(OpenOutbox, LookOnlyCreatesNoTable) {
  TempDir dir;
  const std::string url = "sqlite://" + (dir.path() / "markers.db").string();
  (void)open_recorder(url);  // a recorder's file, no outbox table
  idem::OpenOptions look;
  look.schema = idem::OpenOptions::Schema::look_only;
  auto outbox = idem::open_outbox(url, look);
  EXPECT_TRUE(thrown_by([&] { return outbox->stats(); }).store_error);
}

TEST(OpenOutbox, PrivateInMemorySqliteHasNoOutbox) {
  const Thrown t = thrown_by([] { return idem::open_outbox("sqlite::memory:"); });
  EXPECT_TRUE(t.not_supported) << t.message;
  EXPECT_NE(t.message.find("sqlite::memory:"), std::string::npos) << t.message;
}
#endif

// ---- every scheme: the generic checks ----------------------------------------------------------

TEST(OpenUrl, MalformedUrls) {
  expect_bad_url("", {"URL", "empty"});
  expect_bad_url("/tmp/idem.db", {"scheme", "missing"});
  expect_bad_url(":memory:", {"scheme", "missing"});
  expect_bad_url("ftp://host/x", {"scheme", "'ftp'", "not supported"});
  expect_bad_url("1abc://x", {"scheme", "not a URL scheme"});
  expect_bad_url("mem ory://", {"space"});
  expect_bad_url("memory://#frag", {"fragment"});
  expect_bad_url("sqlite:///tmp/x.db#frag", {"fragment"});
  expect_bad_url("redis://:pw@localhost:6379/0#x", {"fragment"});
  expect_bad_url(std::string_view("memory://\0x", 11), {"control character", "offset 9"});
  expect_bad_url("memory://\n", {"control character"});
  expect_bad_url(std::string(100'000, 'a'), {"URL", "bytes long"});
  expect_bad_url("sqlite:///" + std::string(5000, 'x'), {"bytes long"});
}

TEST(OpenUrl, ErrorsQuoteTheUrlRedacted) {
  const Thrown t =
      thrown_by([] { return open_store("ftp://alice:hunter2@files.example/x?password=s3cr3t"); });
  ASSERT_TRUE(t.config_error);
  EXPECT_NE(t.message.find("ftp://alice:***@files.example/x?password=***"), std::string::npos)
      << t.message;
  EXPECT_EQ(t.message.find("hunter2"), std::string::npos) << t.message;
  EXPECT_EQ(t.message.find("s3cr3t"), std::string::npos) << t.message;
}

#ifdef IDEM_TEST_HAVE_REDIS
TEST(OpenRedis, BadUrlsNameTheWrongPartAndNeverThePassword) {
  expect_bad_url("redis://:hunter2@localhost:99999/0", {"port", "65535", "***"});
  expect_bad_url("REDIS://:hunter2@localhost:abc/0", {"port"});
  expect_bad_url("redis://:hunter2@/0", {"host"});
  expect_bad_url("redis://localhost/zero", {"database"});
  expect_bad_url("redis://localhost/0?prefx=app:", {"'prefx'", "prefix"});
  expect_bad_url("redis://localhost/0?pool_size=0", {"pool_size"});
  expect_bad_url("redis://[::1/0", {"']'"});
  expect_bad_url("redis://localhost/0?tls_verify=no", {"rediss://"});
  expect_bad_url("redis:u:hunter2@localhost/0", {"authority", "redis://"});
  EXPECT_EQ(thrown_by([] { return open_store("redis:u:hunter2@h/0"); }).message.find("hunter2"),
            std::string::npos);
  expect_bad_url("redis://localhost/0?prefix=%zz", {"%-escape"});
  for (const char* url : {"redis://:hunter2@localhost:99999/0", "redis://u:hunter2@[::1/0",
                          "redis://:hunter2@h/0?pool_size=x"}) {
    const Thrown t = thrown_by([&] { return open_recorder(url); });
    EXPECT_TRUE(t.config_error) << url;
    EXPECT_EQ(t.message.find("hunter2"), std::string::npos) << t.message;
  }
}

// A Redis URL's durations are those of every other scheme: the same grammar, the same bound,
// the same words when one is wrong.
TEST(OpenRedis, DurationsTakeTheGrammarOfEveryUrl) {
  // Parsed and accepted: opening reaches the connect (port 1 on the loopback refuses it).
  for (const char* url : {"redis://127.0.0.1:1/0?connect_timeout=500ms&command_timeout=2s&"
                          "wait_timeout=0ms&marker_ttl=7d&expiry_slack=1h",
                          "redis://127.0.0.1:1/0?connect_timeout_ms=500"}) {
    const Thrown t = thrown_by([&] { return open_recorder(url); });
    EXPECT_TRUE(t.store_error) << url << ": " << t.message;
  }
  expect_bad_url("redis://localhost/0?connect_timeout=500", {"'connect_timeout'", "no unit"});
  expect_bad_url("redis://localhost/0?marker_ttl=-1h", {"'marker_ttl'", "negative"});
  expect_bad_url("redis://localhost/0?expiry_slack=1001d", {"'expiry_slack'", "1000d"});
  expect_bad_url("sqlite:///tmp/x.db?busy_timeout=1001d", {"'busy_timeout'", "1000d"});
  expect_bad_url("redis://localhost/0?wait_timeout=1s&wait_timeout_ms=1000",
                 {"wait_timeout", "one way only"});
  expect_bad_url("redis://localhost/0?wait_timeout=1s&wait_timeout=2s", {"given twice"});
}

TEST(OpenRedis, AnUnreachableServerIsARetryableStoreError) {
  // Port 1 on the loopback: nothing listens, the connection is refused at once.
  for (const char* url : {"redis://127.0.0.1:1/0?connect_timeout_ms=500", "redis://[::1]:1/0"}) {
    const Thrown recorder = thrown_by([&] { return open_recorder(url); });
    EXPECT_TRUE(recorder.store_error) << url << ": " << recorder.message;
    EXPECT_TRUE(recorder.retryable) << recorder.message;
    const Thrown store = thrown_by([&] { return open_store(url); });
    EXPECT_TRUE(store.store_error || store.config_error == false) << store.message;
  }
}
#else
TEST(OpenRedis, NotBuiltIsNotSupported) {
  const Thrown t = thrown_by([] { return open_recorder("redis://localhost/0"); });
  EXPECT_TRUE(t.not_supported);
  EXPECT_NE(t.message.find("IDEM_WITH_REDIS"), std::string::npos) << t.message;
}
#endif

#ifdef IDEM_TEST_HAVE_POSTGRES
TEST(OpenPostgres, BadUrlsNameTheWrongPartAndNeverThePassword) {
  expect_bad_url("postgresql://u:hunter2@localhost:abc/db", {"port", "'abc'"});
  expect_bad_url("postgresql://localhost/db?bogus=1", {"bogus"});
  expect_bad_url("postgres://localhost/db?pool_size=0", {"'pool_size'"});
  expect_bad_url("postgresql://localhost/db?schema=1bad", {"schema"});
  expect_bad_url("postgresql://localhost/db?records_table=a-b", {"records_table"});
  expect_bad_url("postgresql://localhost/db?wait_strategy=spin", {"'wait_strategy'", "notify"});
  expect_bad_url("postgresql://localhost/db?statement_timeout=30", {"'statement_timeout'"});
  expect_bad_url("postgresql://localhost/db?connect_timeout=abc", {"'connect_timeout'"});
  expect_bad_url("postgresql://localhost/db?connect_timeout=99999999999999", {"'connect_timeout'"});
  expect_bad_url("postgresql://localhost/db?pool_size=100000", {"'pool_size'"});
  expect_bad_url("postgresql://localhost/db?create_schema=maybe", {"'create_schema'"});
  expect_bad_url("postgresql:localhost/db", {"authority", "postgresql://"});
  // libpq quotes URLs it cannot parse; the password must not come through.
  for (const char* url :
       {"postgresql://u:hunter2@[::1/db", "postgresql://u:hunter2@localhost:abc/db",
        "postgresql://u@localhost/db?password=hunter2&bogus=1"}) {
    const Thrown t = thrown_by([&] { return open_store(url); });
    EXPECT_TRUE(t.config_error) << url << ": " << t.message;
    EXPECT_EQ(t.message.find("hunter2"), std::string::npos) << t.message;
  }
}

TEST(OpenPostgres, AnUnreachableServerIsARetryableStoreError) {
  for (const char* url : {"postgresql://idem@127.0.0.1:1/idem_test?connect_timeout=2",
                          "POSTGRES://idem@[::1]:1/idem_test?connect_timeout=500ms"}) {
    const Thrown t = thrown_by([&] { return open_recorder(url); });
    EXPECT_TRUE(t.store_error) << url << ": " << t.message;
    EXPECT_TRUE(t.retryable) << t.message;
  }
}
#else
TEST(OpenPostgres, NotBuiltIsNotSupported) {
  const Thrown t = thrown_by([] { return open_store("postgresql://localhost/db"); });
  EXPECT_TRUE(t.not_supported);
  EXPECT_NE(t.message.find("IDEM_WITH_POSTGRES"), std::string::npos) << t.message;
}
#endif

TEST(OpenUrl, RandomBytesNeverCrash) {
  // Random text behind the schemes that open nothing remote. Anything may be thrown but an idem
  // error; a URL that happens to be valid opens (memory, or a file inside the temp dir).
  TempDir dir;
  WorkingDir cwd(dir.path());
  std::mt19937 rng(1234);
  const std::string alphabet = "abz09:/?&=%#@[]. -_\x01\x7f\xff";
  for (int i = 0; i < 500; ++i) {
    std::string tail;
    const std::size_t length = rng() % 40;
    for (std::size_t j = 0; j < length; ++j) {
      tail += (rng() % 8 == 0) ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    }
    for (const char* prefix : {"memory:", "memory://?", "sqlite:", "sqlite://", "", "x:"}) {
      const std::string url = prefix + tail;
      try {
        (void)open_recorder(url);
        (void)open_store(url);
      } catch (const idem::Error&) {
      }
      const std::string redacted = idem::redact_url(url);
      EXPECT_LE(redacted.size(), 256u + 3u);
    }
  }
}

// ---- redact_url ------------------------------------------------------------------------------

TEST(RedactUrl, ReplacesPasswordsOnly) {
  using idem::redact_url;
  EXPECT_EQ(redact_url("redis://:secret@10.0.0.5:6380/2?prefix=a:"),
            "redis://:***@10.0.0.5:6380/2?prefix=a:");
  EXPECT_EQ(redact_url("redis://user:secret@host"), "redis://user:***@host");
  EXPECT_EQ(redact_url("postgresql://app:p%40ss@db:5432/orders?sslmode=require&password=x&a=1"),
            "postgresql://app:***@db:5432/orders?sslmode=require&password=***&a=1");
  EXPECT_EQ(redact_url("postgresql://app@db/orders"), "postgresql://app@db/orders");
  EXPECT_EQ(redact_url("postgresql://a:b@c@host/db"), "postgresql://a:***@host/db");
  EXPECT_EQ(redact_url("redis://[::1]:6379/0"), "redis://[::1]:6379/0");
  EXPECT_EQ(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
  EXPECT_EQ(redact_url("x://h/?PassWord=1"), "x://h/?PassWord=***");
  EXPECT_EQ(redact_url("redis:u:pw@host/0"), "redis:u:***@host/0");  // "//" forgotten
  EXPECT_EQ(redact_url(""), "");
  EXPECT_EQ(redact_url(std::string_view("a\0b\n", 4)), "a\\x00b\\x0a");
  const std::string long_url = "memory://?" + std::string(1000, 'q');
  const std::string cut = redact_url(long_url);
  EXPECT_EQ(cut.size(), 259u);
  EXPECT_EQ(cut.substr(256), "...");
  // A password at the very end of a cut URL is redacted before cutting.
  EXPECT_EQ(redact_url("redis://:" + std::string(300, 's') + "@h"), "redis://:***@h");
}

// ---- parse_duration --------------------------------------------------------------------------

TEST(ParseDuration, Units) {
  using idem::parse_duration;
  EXPECT_EQ(parse_duration("0ms"), 0ms);
  EXPECT_EQ(parse_duration("500ms"), 500ms);
  EXPECT_EQ(parse_duration("30s"), 30s);
  EXPECT_EQ(parse_duration("15m"), 15min);
  EXPECT_EQ(parse_duration("12h"), 12h);
  EXPECT_EQ(parse_duration("7d"), 7 * 24h);
  EXPECT_EQ(parse_duration("0007s"), 7s);
  EXPECT_EQ(parse_duration("9223372036854775807ms"), std::chrono::milliseconds::max());
  EXPECT_EQ(parse_duration("2w"), 14 * 24h);
  EXPECT_EQ(parse_duration("1.5h"), 90min);
  EXPECT_EQ(parse_duration("0.25s"), 250ms);
  EXPECT_EQ(parse_duration("1.0d"), 24h);
  EXPECT_EQ(parse_duration("0.001s"), 1ms);
  EXPECT_EQ(parse_duration("0.5w"), 84h);
  EXPECT_EQ(parse_duration("9223372036854775.807s"), std::chrono::milliseconds::max());
}

TEST(ParseDuration, RefusesEverythingElse) {
  for (const auto& [text, why] :
       std::initializer_list<std::pair<std::string_view, std::string_view>>{
           {"", "empty"},
           {"5", "no unit"},
           {"-5s", "negative"},
           {"+5s", "start with a number"},
           {" 5s", "start with a number"},
           {"5 s", "unknown unit"},
           {"5S", "unknown unit"},
           {"1.5us", "unknown unit"},
           {"0.0001s", "whole number of milliseconds"},
           {"1.5ms", "whole number of milliseconds"},
           {"1.s", "no digit after the point"},
           {"1.5", "no unit"},
           {".5s", "number"},
           {"0.1234567891h", "more than 9 digits"},
           {"9223372036854775.808s", "too large"},
           {"5sec", "unknown unit"},
           {"5us", "unknown unit"},
           {"s", "start with a number"},
           {"9223372036854775808ms", "too large"},
           {"106751991167301d", "too large"},
           {"99999999999999999999999999s", "too large"},
           {std::string_view("5\0s", 3), "unknown unit"},
       }) {
    try {
      (void)idem::parse_duration(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const idem::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos)
          << "'" << e.what() << "' does not say '" << why << "'";
    }
  }
}

}  // namespace
