// postgresql:// and postgres:// — idem::postgres. idem's own settings are query parameters taken
// out here; the rest of the URL goes to libpq.
#include "idem/postgres/postgres_options.hpp"
#include "idem/postgres/postgres_outbox.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "scheme.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::detail {
namespace {

// idem's own settings come as query parameters; they are taken out and the rest of the URL
// (libpq's parameters: sslmode, application_name, ...) goes to libpq, which refuses unknown
// ones.
postgres::PostgresOptions postgres_options(const UrlContext& context, const SplitUrl& split,
                                           const OpenOptions& open) {
  const auto [location, query] = split_query(split.rest);
  if (location.substr(0, 2) != "//") {
    context.fail("authority", "a PostgreSQL URL starts with " + split.scheme +
                                  ":// (e.g. postgresql://user@host:5432/dbname)");
  }
  postgres::PostgresOptions options;
  options.clock = open.clock;
  std::string forwarded;
  for (const QueryParameter& parameter : parse_query(context, query)) {
    const std::string& name = parameter.name;
    if (name == "schema") {
      options.schema = parameter.value;
    } else if (name == "pool_size") {
      options.pool_size = count_value(context, parameter, 1, kMaxPoolSize);
    } else if (name == "connect_timeout") {
      // libpq's own spelling is whole seconds ("10"); a unit is accepted too ("500ms"). idem
      // enforces it itself (libpq's is not applied to idem's non-blocking connect).
      const bool bare_seconds = !parameter.value.empty() && parameter.value.find_first_not_of(
                                                                "0123456789") == std::string::npos;
      options.connect_timeout =
          bare_seconds ? std::chrono::seconds(count_value(context, parameter, 1, kMaxSeconds))
                       : duration_value(context, parameter);
    } else if (name == "acquire_timeout") {
      options.acquire_timeout = duration_value(context, parameter);
    } else if (name == "statement_timeout") {
      options.statement_timeout = duration_value(context, parameter);
    } else if (name == "wait_strategy") {
      options.wait_strategy = choice_value<postgres::WaitStrategy>(
          context, parameter,
          {{"notify", postgres::WaitStrategy::notify}, {"poll", postgres::WaitStrategy::poll}});
    } else if (name == "wait_recheck_interval") {
      options.wait_recheck_interval = duration_value(context, parameter);
    } else if (name == "create_schema") {
      options.create_schema = bool_value(context, parameter);
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
  // After the query: the caller's choice wins over the URL's parameters.
  if (open.schema != OpenOptions::Schema::create) options.create_schema = false;
  // libpq wants the scheme in lower case.
  options.url = split.scheme + ":" + std::string(location);
  if (!forwarded.empty()) options.url += "?" + forwarded;
  return options;
}

}  // namespace

OpenPlan postgres_url(const UrlContext& context, const SplitUrl& split, OpenFace /*face*/,
                      const OpenOptions& options) {
  const postgres::PostgresOptions parsed = postgres_options(context, split, options);
  return {
      .recorder =
          [parsed] { return std::make_shared<postgres::PostgresIdempotencyRecorder>(parsed); },
      .store = [parsed] { return std::make_shared<postgres::PostgresIdempotencyStore>(parsed); },
      .outbox = [parsed] { return std::make_shared<postgres::PostgresOutbox>(parsed); }};
}

}  // namespace idem::detail
