#include "idem/open.hpp"

#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "idem/error.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "url.hpp"

#ifdef IDEM_OPEN_HAVE_SQLITE
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#endif
#ifdef IDEM_OPEN_HAVE_REDIS
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#endif
#ifdef IDEM_OPEN_HAVE_POSTGRES
#include "idem/postgres/postgres_options.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#endif

namespace idem {
namespace {

// Upper bounds of counts given in URLs (see detail::count_value).
constexpr std::size_t kMaxShards = 65'536;
constexpr std::size_t kMaxPoolSize = 10'000;
constexpr std::size_t kMaxCount = 1'000'000'000;
constexpr std::size_t kMaxSeconds = 86'400'000;  // 1000 days, as durations (url.cpp)

using detail::QueryParameter;
using detail::UrlContext;

// Runs `open` (a backend constructor); a ConfigError it throws gets the URL context (and loses
// any secret it might quote). Other errors pass unchanged: they never contain the URL.
template <class Open>
auto with_context(const UrlContext& context, Open&& open) {
  try {
    return open();
  } catch (const ConfigError& e) {
    context.rethrow_backend_config_error(e.what());
  }
}

// Splits "//authority/path?query" / "path?query" at the '?'.
std::pair<std::string_view, std::string_view> split_query(std::string_view rest) {
  const std::size_t question = rest.find('?');
  if (question == std::string_view::npos) return {rest, {}};
  return {rest.substr(0, question), rest.substr(question + 1)};
}

// ---- memory:// -------------------------------------------------------------------------------

std::vector<QueryParameter> memory_parameters(const UrlContext& context, std::string_view rest) {
  const auto [location, query] = split_query(rest);
  // "memory:", "memory://": there is nothing to locate.
  if (!location.empty() && location != "//") {
    context.fail(location.substr(0, 2) == "//" ? "host or path" : "path",
                 "memory URLs name no host and no path: write memory:// (with an optional "
                 "?query)");
  }
  return detail::parse_query(context, query);
}

InMemoryRecorderOptions memory_recorder_options(const UrlContext& context, std::string_view rest,
                                                const OpenOptions& open) {
  InMemoryRecorderOptions options;
  options.clock = open.clock;
  for (const QueryParameter& parameter : memory_parameters(context, rest)) {
    if (parameter.name == "shards") {
      options.shards = detail::count_value(context, parameter, 1, kMaxShards);
    } else {
      detail::unknown_parameter(context, parameter, "a memory:// recorder", "shards");
    }
  }
  return options;
}

InMemoryStoreOptions memory_store_options(const UrlContext& context, std::string_view rest,
                                          const OpenOptions& open) {
  InMemoryStoreOptions options;
  options.clock = open.clock;
  for (const QueryParameter& parameter : memory_parameters(context, rest)) {
    if (parameter.name == "capacity") {
      options.capacity = detail::count_value(context, parameter, 1, kMaxCount);
    } else if (parameter.name == "when_full") {
      if (parameter.value == "reject") {
        options.when_full = InMemoryStoreOptions::WhenFull::reject;
      } else if (parameter.value == "evict_oldest_completed") {
        options.when_full = InMemoryStoreOptions::WhenFull::evict_oldest_completed;
      } else {
        context.fail("query parameter 'when_full'",
                     "must be reject or evict_oldest_completed, got '" +
                         detail::printable(parameter.value, 64) + "'");
      }
    } else if (parameter.name == "shards") {
      options.shards = detail::count_value(context, parameter, 1, kMaxShards);
    } else {
      detail::unknown_parameter(context, parameter, "a memory:// store",
                                "capacity, when_full, shards");
    }
  }
  return options;
}

// ---- sqlite: ---------------------------------------------------------------------------------

#ifdef IDEM_OPEN_HAVE_SQLITE
struct SqliteTarget {
  std::string path;
  sqlite::SqliteOptions options;
};

SqliteTarget sqlite_target(const UrlContext& context, std::string_view rest,
                           const OpenOptions& open) {
  const auto [location, query] = split_query(rest);
  SqliteTarget target;
  std::string_view path = location;
  if (location.substr(0, 2) == "//") {
    // sqlite://<authority><path>: the authority must be empty (the file is on this machine).
    const std::string_view after = location.substr(2);
    const std::size_t slash = after.find('/');
    const std::string_view authority = after.substr(0, slash);
    if (!authority.empty()) {
      context.fail("host", "'" + detail::printable(authority, 64) +
                               "': SQLite URLs name no host; write sqlite:///absolute/path.db "
                               "(three slashes) or sqlite:relative/path.db");
    }
    path = slash == std::string_view::npos ? std::string_view() : after.substr(slash);
  }
  if (path.empty()) {
    context.fail("path",
                 "is missing (sqlite:///absolute/path.db, sqlite:relative/path.db or "
                 "sqlite::memory:)");
  }
  target.path = detail::percent_decode(context, path, "path");
  target.options.clock = open.clock;
  for (const QueryParameter& parameter : detail::parse_query(context, query)) {
    auto& options = target.options;
    if (parameter.name == "durability") {
      if (parameter.value == "full") {
        options.durability = sqlite::Durability::full;
      } else if (parameter.value == "normal") {
        options.durability = sqlite::Durability::normal;
      } else if (parameter.value == "off") {
        options.durability = sqlite::Durability::off;
      } else {
        context.fail(
            "query parameter 'durability'",
            "must be full, normal or off, got '" + detail::printable(parameter.value, 64) + "'");
      }
    } else if (parameter.name == "busy_timeout") {
      options.busy_timeout = detail::duration_value(context, parameter);
    } else if (parameter.name == "read_only") {
      options.read_only = detail::bool_value(context, parameter);
    } else if (parameter.name == "create_schema") {
      options.create_schema = detail::bool_value(context, parameter);
    } else if (parameter.name == "max_batch_size") {
      options.max_batch_size = detail::count_value(context, parameter, 1, kMaxCount);
    } else if (parameter.name == "max_idle_readers") {
      options.max_idle_readers = detail::count_value(context, parameter, 0, kMaxPoolSize);
    } else {
      detail::unknown_parameter(context, parameter, "sqlite:",
                                "durability, busy_timeout, read_only, create_schema, "
                                "max_batch_size, max_idle_readers");
    }
  }
  return target;
}
#endif

// ---- redis:// --------------------------------------------------------------------------------

#ifdef IDEM_OPEN_HAVE_REDIS
redis::RedisOptions redis_options(const UrlContext& context, const detail::SplitUrl& split,
                                  const OpenOptions& open) {
  // Checked here, not by from_url: its message would quote the start of the URL, and without
  // "//" a password cannot be told apart to be redacted.
  if (split.rest.substr(0, 2) != "//") {
    context.fail("authority",
                 "a Redis URL starts with " + split.scheme + ":// (e.g. redis://localhost:6379/0)");
  }
  // RedisOptions::from_url parses the rest (it wants the scheme in lower case).
  const std::string url = split.scheme + ":" + std::string(split.rest);
  redis::RedisOptions options =
      with_context(context, [&] { return redis::RedisOptions::from_url(url); });
  options.clock = open.clock;
  return options;
}
#endif

// ---- postgresql:// ---------------------------------------------------------------------------

#ifdef IDEM_OPEN_HAVE_POSTGRES
// idem's own settings come as query parameters; they are taken out and the rest of the URL
// (libpq's parameters: sslmode, application_name, ...) goes to libpq, which refuses unknown
// ones.
postgres::PostgresOptions postgres_options(const UrlContext& context, const detail::SplitUrl& split,
                                           const OpenOptions& open) {
  const auto [location, query] = split_query(split.rest);
  if (location.substr(0, 2) != "//") {
    context.fail("authority", "a PostgreSQL URL starts with " + split.scheme +
                                  ":// (e.g. postgresql://user@host:5432/dbname)");
  }
  postgres::PostgresOptions options;
  options.clock = open.clock;
  std::string forwarded;
  for (const QueryParameter& parameter : detail::parse_query(context, query)) {
    const std::string& name = parameter.name;
    if (name == "schema") {
      options.schema = parameter.value;
    } else if (name == "pool_size") {
      options.pool_size = detail::count_value(context, parameter, 1, kMaxPoolSize);
    } else if (name == "connect_timeout") {
      // libpq's own spelling is whole seconds ("10"); a unit is accepted too ("500ms"). idem
      // enforces it itself (libpq's is not applied to idem's non-blocking connect).
      const bool bare_seconds = !parameter.value.empty() && parameter.value.find_first_not_of(
                                                                "0123456789") == std::string::npos;
      options.connect_timeout =
          bare_seconds
              ? std::chrono::seconds(detail::count_value(context, parameter, 1, kMaxSeconds))
              : detail::duration_value(context, parameter);
    } else if (name == "acquire_timeout") {
      options.acquire_timeout = detail::duration_value(context, parameter);
    } else if (name == "statement_timeout") {
      options.statement_timeout = detail::duration_value(context, parameter);
    } else if (name == "wait_strategy") {
      if (parameter.value == "notify") {
        options.wait_strategy = postgres::WaitStrategy::notify;
      } else if (parameter.value == "poll") {
        options.wait_strategy = postgres::WaitStrategy::poll;
      } else {
        context.fail(
            "query parameter 'wait_strategy'",
            "must be notify or poll, got '" + detail::printable(parameter.value, 64) + "'");
      }
    } else if (name == "wait_recheck_interval") {
      options.wait_recheck_interval = detail::duration_value(context, parameter);
    } else if (name == "create_schema") {
      options.create_schema = detail::bool_value(context, parameter);
    } else if (name == "processed_log_table") {
      options.processed_log_table = parameter.value;
    } else if (name == "claims_table") {
      options.claims_table = parameter.value;
    } else if (name == "records_table") {
      options.records_table = parameter.value;
    } else if (name == "notify_channel") {
      options.notify_channel = parameter.value;
    } else if (name == "password_file") {
      options.password_file = parameter.value;
    } else if (name == "password_env") {
      options.password_env = parameter.value;
    } else if (name == "sslpassword_file") {
      options.sslpassword_file = parameter.value;
    } else if (name == "sslpassword_env") {
      options.sslpassword_env = parameter.value;
    } else {
      forwarded += (forwarded.empty() ? "" : "&") + std::string(parameter.raw);
    }
  }
  // libpq wants the scheme in lower case.
  options.url = split.scheme + ":" + std::string(location);
  if (!forwarded.empty()) options.url += "?" + forwarded;
  return options;
}
#endif

[[noreturn]] void unknown_scheme(const UrlContext& context, const std::string& scheme) {
  context.fail("scheme", "'" + detail::printable(scheme, 32) +
                             "' is not supported (expected memory, sqlite, redis, postgresql "
                             "or postgres)");
}

// Everything a URL asks for, parsed and checked, before anything is opened: open_recorder and
// open_store share the parsing and differ only in the class they construct (and the memory
// scheme's options, which differ by face).
using Plan = std::variant<InMemoryRecorderOptions, InMemoryStoreOptions
#ifdef IDEM_OPEN_HAVE_SQLITE
                          ,
                          SqliteTarget
#endif
#ifdef IDEM_OPEN_HAVE_REDIS
                          ,
                          redis::RedisOptions
#endif
#ifdef IDEM_OPEN_HAVE_POSTGRES
                          ,
                          postgres::PostgresOptions
#endif
                          >;

Plan plan(const UrlContext& context, detail::OpenFace face, const OpenOptions& options) {
  const detail::SplitUrl split = detail::split_scheme(context);
  if (split.scheme == "memory") {
    if (face == detail::OpenFace::recorder)
      return memory_recorder_options(context, split.rest, options);
    return memory_store_options(context, split.rest, options);
  }
  if (split.scheme == "sqlite") {
#ifdef IDEM_OPEN_HAVE_SQLITE
    return sqlite_target(context, split.rest, options);
#else
    context.not_built("sqlite", "SQLite", "IDEM_WITH_SQLITE", "libsqlite3-dev");
#endif
  }
  if (split.scheme == "redis" || split.scheme == "rediss") {
#ifdef IDEM_OPEN_HAVE_REDIS
    return redis_options(context, split, options);
#else
    context.not_built(split.scheme, "Redis", "IDEM_WITH_REDIS", "libhiredis-dev");
#endif
  }
  if (split.scheme == "postgresql" || split.scheme == "postgres") {
#ifdef IDEM_OPEN_HAVE_POSTGRES
    return postgres_options(context, split, options);
#else
    context.not_built(split.scheme, "PostgreSQL", "IDEM_WITH_POSTGRES", "libpq-dev");
#endif
  }
  unknown_scheme(context, split.scheme);
}

// The other face's memory options: plan() never returns them for this face.
template <class Interface>
std::shared_ptr<Interface> other_face() {
  throw InvalidArgument("idem::open: internal error: a plan for the other face");
}

// The object for one alternative of a plan: Interface (recorder or store) picks the memory,
// SQLite, Redis or PostgreSQL class.
template <class Interface, class Memory, class Sqlite, class Redis, class Postgres,
          class MemoryOptions, class Chosen>
std::shared_ptr<Interface> make_object(Chosen& chosen) {
  if constexpr (std::is_same_v<Chosen, MemoryOptions>) {
    return std::make_shared<Memory>(std::move(chosen));
#ifdef IDEM_OPEN_HAVE_SQLITE
  } else if constexpr (std::is_same_v<Chosen, SqliteTarget>) {
    return std::make_shared<Sqlite>(std::move(chosen.path), std::move(chosen.options));
#endif
#ifdef IDEM_OPEN_HAVE_REDIS
  } else if constexpr (std::is_same_v<Chosen, redis::RedisOptions>) {
    return std::make_shared<Redis>(std::move(chosen));
#endif
#ifdef IDEM_OPEN_HAVE_POSTGRES
  } else if constexpr (std::is_same_v<Chosen, postgres::PostgresOptions>) {
    return std::make_shared<Postgres>(std::move(chosen));
#endif
  } else {
    return other_face<Interface>();
  }
}

template <class Interface, class Memory, class Sqlite, class Redis, class Postgres,
          class MemoryOptions>
std::shared_ptr<Interface> construct(const UrlContext& context, Plan&& plan) {
  return std::visit(
      [&](auto& chosen) {
        return with_context(context, [&] {
          return make_object<Interface, Memory, Sqlite, Redis, Postgres, MemoryOptions>(chosen);
        });
      },
      plan);
}

#ifndef IDEM_OPEN_HAVE_SQLITE
namespace sqlite {
using SqliteIdempotencyRecorder = void;
using SqliteIdempotencyStore = void;
}  // namespace sqlite
#endif
#ifndef IDEM_OPEN_HAVE_REDIS
namespace redis {
using RedisIdempotencyRecorder = void;
using RedisIdempotencyStore = void;
}  // namespace redis
#endif
#ifndef IDEM_OPEN_HAVE_POSTGRES
namespace postgres {
using PostgresIdempotencyRecorder = void;
using PostgresIdempotencyStore = void;
}  // namespace postgres
#endif

}  // namespace

namespace detail {
void check_open_url(std::string_view url, OpenFace face) {
  const UrlContext context(face == OpenFace::recorder ? "open_recorder" : "open_store", url);
  (void)plan(context, face, OpenOptions{});
}
}  // namespace detail

std::shared_ptr<IdempotencyRecorder> open_recorder(std::string_view url,
                                                   const OpenOptions& options) {
  const UrlContext context("open_recorder", url);
  return construct<IdempotencyRecorder, InMemoryIdempotencyRecorder,
                   sqlite::SqliteIdempotencyRecorder, redis::RedisIdempotencyRecorder,
                   postgres::PostgresIdempotencyRecorder, InMemoryRecorderOptions>(
      context, plan(context, detail::OpenFace::recorder, options));
}

std::shared_ptr<IdempotencyStore> open_store(std::string_view url, const OpenOptions& options) {
  const UrlContext context("open_store", url);
  return construct<IdempotencyStore, InMemoryIdempotencyStore, sqlite::SqliteIdempotencyStore,
                   redis::RedisIdempotencyStore, postgres::PostgresIdempotencyStore,
                   InMemoryStoreOptions>(context, plan(context, detail::OpenFace::store, options));
}

}  // namespace idem
