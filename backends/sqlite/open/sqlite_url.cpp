// sqlite:///absolute/path.db, sqlite:relative/path.db, sqlite::memory: — idem::sqlite.
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "scheme.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::detail {
namespace {

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
      context.fail("host", "'" + printable(authority, 64) +
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
  target.path = percent_decode(context, path, "path");
  target.options.clock = open.clock;
  for (const QueryParameter& parameter : parse_query(context, query)) {
    auto& options = target.options;
    if (parameter.name == "durability") {
      options.durability = choice_value<sqlite::Durability>(context, parameter,
                                                            {{"full", sqlite::Durability::full},
                                                             {"normal", sqlite::Durability::normal},
                                                             {"off", sqlite::Durability::off}});
    } else if (parameter.name == "busy_timeout") {
      options.busy_timeout = duration_value(context, parameter);
    } else if (parameter.name == "read_only") {
      options.read_only = bool_value(context, parameter);
    } else if (parameter.name == "create_schema") {
      options.create_schema = bool_value(context, parameter);
    } else if (parameter.name == "max_batch_size") {
      options.max_batch_size = count_value(context, parameter, 1, kMaxCount);
    } else if (parameter.name == "max_idle_readers") {
      options.max_idle_readers = count_value(context, parameter, 0, kMaxPoolSize);
    } else {
      unknown_parameter(context, parameter, "sqlite:",
                        "durability, busy_timeout, read_only, create_schema, "
                        "max_batch_size, max_idle_readers");
    }
  }
  // After the query: the caller's choice wins over the URL's parameters.
  if (open.schema != OpenOptions::Schema::create) target.options.create_schema = false;
  if (open.schema == OpenOptions::Schema::look_only) target.options.read_only = true;
  return target;
}

}  // namespace

OpenPlan sqlite_url(const UrlContext& context, const SplitUrl& split, OpenFace /*face*/,
                    const OpenOptions& options) {
  const SqliteTarget target = sqlite_target(context, split.rest, options);
  return {
      .recorder =
          [target] {
            return std::make_shared<sqlite::SqliteIdempotencyRecorder>(target.path, target.options);
          },
      .store =
          [target] {
            return std::make_shared<sqlite::SqliteIdempotencyStore>(target.path, target.options);
          },
      .outbox = [target]() -> std::shared_ptr<Outbox> {
        if (target.path == ":memory:") {
          throw NotSupported(
              "open_outbox: sqlite::memory: is a private in-memory database: it has no outbox a "
              "relay could share (use a SQLite file)");
        }
        return std::make_shared<sqlite::SqliteOutbox>(target.path, target.options);
      }};
}

}  // namespace idem::detail
