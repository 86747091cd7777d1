// The demo's namespace in its store (store_namespace.hpp).
#include "store_namespace.hpp"

#include <cctype>
#include <iostream>
#include <string_view>
#include <system_error>
#include <vector>

#include "../exit_codes.hpp"
#include "../outbox_commands.hpp"
#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/open.hpp"
#include "ledger.hpp"

#ifdef IDEM_HAVE_SQLITE
#include "idem/sqlite/sqlite_recorder.hpp"
#endif
#ifdef IDEM_HAVE_REDIS
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#endif

namespace idem::cli::demo {
namespace {

namespace fs = std::filesystem;

std::string lower_scheme(std::string_view url) {
  std::string scheme(url.substr(0, url.find(':')));
  for (char& c : scheme)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return scheme;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "%41" -> "A"; a malformed escape is kept as it is (open_recorder then names it).
std::string percent_decoded(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 &&
        hex_value(text[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

[[maybe_unused]] std::string percent_encoded(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) != 0 || c == '-' || c == '_' || c == '.' || c == ':') {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

// The file a sqlite: URL names ("" for sqlite::memory:): sqlite:///abs/path or
// sqlite:relative/path, without the query. A URL open_recorder would refuse is left to it.
std::string sqlite_path(std::string_view url) {
  std::string_view rest = url.substr(url.find(':') + 1);
  rest = rest.substr(0, rest.find('?'));
  if (rest.substr(0, 2) == "//") {
    const std::size_t slash = rest.find('/', 2);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  }
  const std::string path = percent_decoded(rest);
  return path == ":memory:" ? std::string() : path;
}

// What the store at `url` (opened without creating anything) holds, "" when nothing: markers,
// outbox rows, store records.
std::string what_store_holds(const std::string& url) {
  std::vector<std::string> held;
  // A face whose tables do not exist (a non-retryable open error) holds nothing.
  auto absent = [](const StoreError& e) { return !e.retryable(); };
  std::shared_ptr<IdempotencyRecorder> recorder;
  try {
    recorder = open_recorder(url);
  } catch (const StoreError& e) {
    if (!absent(e)) throw;
  }
  if (recorder) {
    try {
      const std::vector<ConsumerCounts> counts = recorder->consumer_counts();
      std::uint64_t markers = 0;
      for (const ConsumerCounts& c : counts)
        markers += c.processed + c.in_progress;
      if (!counts.empty()) {
        held.push_back(std::to_string(markers) + " markers and claims of " +
                       std::to_string(counts.size()) + " consumer(s), e.g. '" +
                       counts.front().consumer + "'");
      }
    } catch (const NotSupported&) {
    }
    if (const auto outbox = outbox_of(url, /*look_only=*/true)) {
      const OutboxStats stats = outbox->stats();
      if (stats.depth + stats.parked > 0) {
        held.push_back(std::to_string(stats.depth + stats.parked) + " outbox rows");
      }
    }
  }
  try {
    if (const std::size_t records = open_store(url)->entry_count(); records > 0) {
      held.push_back(std::to_string(records) + " idempotency records");
    }
  } catch (const StoreError& e) {
    if (!absent(e)) throw;
  }
  std::string text;
  for (const std::string& part : held)
    text += (text.empty() ? "" : ", ") + part;
  return text;
}

[[noreturn]] void refuse(const std::string& url, const std::string& held) {
  throw InvalidArgument("--store " + redact_url(url) + " already holds data (" + held +
                        "); the demo changes nothing of it, but runs only on an empty store "
                        "unless you pass --allow-nonempty-store (it then writes under a namespace "
                        "of its own and removes it at the end)");
}

#ifdef IDEM_HAVE_REDIS
// `prefix` as a SCAN MATCH pattern for its keys.
std::string glob_of_prefix(const std::string& prefix) {
  std::string pattern;
  for (const char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') pattern += '\\';
    pattern += c;
  }
  return pattern + "*";
}

void delete_redis_prefix(IdempotencyRecorder& recorder, const std::string& prefix) {
  auto& redis_recorder = dynamic_cast<redis::RedisIdempotencyRecorder&>(recorder);
  redis::ConnectionLease connection = redis_recorder.pool()->lease();
  const std::string pattern = glob_of_prefix(prefix);
  std::string cursor = "0";
  do {
    const redis::RedisReply page =
        connection->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"},
                            redis::CommandKind::read, "demo clean-up");
    if (page.is_error() || page.elements.size() != 2) {
      throw StoreError("SCAN of the demo's keys failed: " + page.str, /*retryable=*/true);
    }
    cursor = page.elements[0].str;
    if (page.elements[1].elements.empty()) continue;
    std::vector<std::string_view> unlink = {"UNLINK"};
    for (const redis::RedisReply& key : page.elements[1].elements)
      unlink.push_back(key.str);
    const redis::RedisReply gone =
        connection->command(unlink, redis::CommandKind::idempotent_write, "demo clean-up");
    if (gone.is_error()) throw StoreError("UNLINK of the demo's keys failed: " + gone.str, true);
  } while (cursor != "0");
}
#endif

}  // namespace

std::string with_query_parameter(const std::string& url, const std::string& name,
                                 const std::string& value) {
  const std::size_t question = url.find('?');
  std::string result = url.substr(0, question);
  std::string query;
  if (question != std::string::npos) {
    std::string_view rest = std::string_view(url).substr(question + 1);
    while (!rest.empty()) {
      const std::size_t amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      if (!pair.empty() && pair.substr(0, pair.find('=')) != name) {
        query += (query.empty() ? "" : "&") + std::string(pair);
      }
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    }
  }
  query += (query.empty() ? "" : "&") + name + "=" + value;
  return result + "?" + query;
}

StoreNamespace::StoreNamespace(const DemoOptions& options, std::string run) {
  if (options.store.empty()) {
#ifndef IDEM_HAVE_SQLITE
    throw NotSupported(
        "this idem was built without the SQLite backend (IDEM_WITH_SQLITE=OFF), the demo's "
        "default recorder: give --store redis://... or --store postgresql://...");
#endif
    if (!options.broker.empty()) run_ = std::move(run);  // fresh consumer names on the broker
    return;
  }
  run_ = std::move(run);
  url_ = options.store;
  const std::string scheme = lower_scheme(options.store);
  if (scheme == "sqlite") {
    const std::string path = sqlite_path(options.store);
    if (path.empty()) {
      kind_ = Kind::other;  // sqlite::memory: is refused when opened
      return;
    }
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      kind_ = Kind::new_sqlite_file;
      sqlite_path_ = path;
      return;
    }
    if (!options.allow_nonempty_store) {
      throw InvalidArgument("--store " + redact_url(options.store) + ": the file '" + path +
                            "' already exists, and the demo changes nothing it did not make; "
                            "give the path of a new file (the demo deletes it at the end), or "
                            "pass --allow-nonempty-store to run beside what it holds (the "
                            "demo's own rows and table are deleted at the end)");
    }
    kind_ = Kind::shared_sqlite_file;
    return;
  }
  if (scheme == "postgresql" || scheme == "postgres") {
    if (!options.allow_nonempty_store) {
      const std::string held =
          what_store_holds(with_query_parameter(options.store, "create_schema", "false"));
      if (!held.empty()) refuse(options.store, held);
    }
    kind_ = Kind::postgres_schema;
    schema_ = "idem_demo_" + run_.substr(run_.rfind('-') + 1);
    url_ = with_query_parameter(options.store, "schema", schema_);
    // The demo's schema is made when its recorder opens, whatever the URL said about the user's.
    if (url_.find("create_schema=") != std::string::npos) {
      url_ = with_query_parameter(url_, "create_schema", "true");
    }
    return;
  }
#ifdef IDEM_HAVE_REDIS
  if (scheme == "redis" || scheme == "rediss") {
    if (!options.allow_nonempty_store) {
      const std::string held = what_store_holds(options.store);
      if (!held.empty()) refuse(options.store, held);
    }
    kind_ = Kind::redis_prefix;
    prefix_ = redis::RedisOptions::from_url(options.store).key_prefix + run_ + ":";
    url_ = with_query_parameter(options.store, "prefix", percent_encoded(prefix_));
    return;
  }
#endif
  kind_ = Kind::other;  // memory:// or a scheme open_recorder refuses
}

void StoreNamespace::place_default(const fs::path& work_dir) {
  if (kind_ == Kind::work_dir) url_ = "sqlite://" + fs::absolute(work_dir / "idem.db").string();
}

std::string StoreNamespace::consumer(const std::string& role) const {
  return run_.empty() ? role : run_ + "." + role;
}

std::string StoreNamespace::ledger(const IdempotencyRecorder& recorder) const {
  return ledger_table(recorder, kind_ == Kind::shared_sqlite_file ? run_ : std::string());
}

void StoreNamespace::remove(std::shared_ptr<IdempotencyRecorder>& recorder) noexcept {
  try {
    switch (kind_) {
      case Kind::work_dir:
      case Kind::other:
        break;
      case Kind::new_sqlite_file: {
#ifdef IDEM_HAVE_SQLITE
        // Only the file the demo found missing and then made: should the URL have named another
        // one (a path this reading of the URL got wrong), nothing is deleted.
        const auto* file = dynamic_cast<const sqlite::SqliteIdempotencyRecorder*>(recorder.get());
        if (file != nullptr && file->path() != sqlite_path_) {
          throw StoreError("the demo's file is " + file->path() + ", not " + sqlite_path_, false);
        }
#endif
        recorder.reset();  // closed before its file goes
        for (const char* suffix : {"", "-wal", "-shm", "-journal", "-outbox.lock"}) {
          std::error_code ec;
          fs::remove(sqlite_path_ + suffix, ec);
        }
        break;
      }
      case Kind::shared_sqlite_file: {
        if (!recorder) break;
        const std::string ledger = this->ledger(*recorder);
        const std::string billing = consumer("billing");
        const std::string shipping = consumer("shipping");
        run_sql(*recorder, [&](SqlTransaction& sql) {
          const std::string mine = " WHERE consumer IN ($1, $2)";
          sql.exec("DELETE FROM processed_log" + mine, {billing, shipping});
          sql.exec("DELETE FROM idem_claims" + mine, {billing, shipping});
          if (sql.query_int64("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND "
                              "name = 'idem_outbox'")
                  .value_or(0) > 0) {
            sql.exec("DELETE FROM idem_outbox" + mine, {billing, shipping});
          }
          sql.exec("DROP TABLE IF EXISTS " + ledger);
        });
        break;
      }
      case Kind::postgres_schema:
        if (!recorder) break;
        run_sql(*recorder,
                [&](SqlTransaction& sql) { sql.exec("DROP SCHEMA \"" + schema_ + "\" CASCADE"); });
        break;
      case Kind::redis_prefix:
#ifdef IDEM_HAVE_REDIS
        if (recorder) delete_redis_prefix(*recorder, prefix_);
#endif
        break;
    }
  } catch (const std::exception& e) {
    std::cerr << "idem demo: could not remove the demo's data from " << redact_url(url_) << ": "
              << describe(e) << "\n"
              << kept();
  }
  recorder.reset();
}

std::string StoreNamespace::kept() const {
  const std::string shown = redact_url(url_);
  switch (kind_) {
    case Kind::work_dir:
    case Kind::other:
      return {};
    case Kind::new_sqlite_file:
      return "  store:     " + sqlite_path_ + " (the demo's file)\n";
    case Kind::shared_sqlite_file:
      return "  store:     consumers " + consumer("billing") + " and " + consumer("shipping") +
             ", table idem_demo_" + run_.substr(run_.rfind('-') + 1) + "_ledger in " + shown + "\n";
    case Kind::postgres_schema:
      return "  store:     schema " + schema_ + " (remove it: DROP SCHEMA " + schema_ +
             " CASCADE)\n";
    case Kind::redis_prefix:
      return "  store:     keys under the prefix " + prefix_ + "\n";
  }
  return {};
}

}  // namespace idem::cli::demo
