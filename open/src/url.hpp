// Internal: the small URL toolkit behind idem/open.hpp — splitting off the scheme and the query,
// %-decoding, typed query values, and error messages that name the wrong part and quote the URL
// redacted.
//
// Why not a URL library (liburiparser): only memory:// and sqlite: are split here. Redis URLs go
// to RedisOptions::from_url and PostgreSQL URLs to libpq, which parse their own; and
// "sqlite:relative/path" / "sqlite::memory:" are not the hierarchical URLs such libraries model.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/printable.hpp"

namespace idem::detail {

// The URL being opened, for messages: "<part>: <problem> (URL '<redacted>')". They name the URL's
// parts and parameters, never the function or the options struct behind them (a CLI user never
// called open_store).
class UrlContext {
 public:
  explicit UrlContext(std::string_view url) : url_(url) {}

  std::string_view url() const noexcept { return url_; }

  // Throws ConfigError "<part>: <problem> (URL '<redacted url>')".
  [[noreturn]] void fail(std::string_view part, std::string_view problem) const;
  // Throws NotSupported for a scheme whose backend was not built.
  [[noreturn]] void not_built(std::string_view scheme, std::string_view backend,
                              std::string_view cmake_option, std::string_view package) const;
  // A backend's ConfigError message, in the URL's words (its options struct not named) and
  // scrubbed of every secret the URL holds (libpq quotes the URL it could not parse, password
  // included).
  [[noreturn]] void rethrow_backend_config_error(std::string_view message) const;

 private:
  std::string_view url_;
};

// The URL split at its first ':' after checks every scheme shares (not empty, not too long, no
// control characters or spaces, no fragment, a well-formed scheme).
struct SplitUrl {
  std::string scheme;     // lower case
  std::string_view rest;  // everything after "scheme:"
};
SplitUrl split_scheme(const UrlContext& context);

// "%41" -> "A". `part` names what is decoded, for the message.
std::string percent_decode(const UrlContext& context, std::string_view text, std::string_view part);

struct QueryParameter {
  std::string name;      // %-decoded
  std::string value;     // %-decoded
  std::string_view raw;  // "name=value" as written
};
// "a=1&b=2" -> parameters. Empty pairs ("a=1&&b=2", a trailing '&') are skipped; a pair without
// '=' or a name given twice is a ConfigError.
std::vector<QueryParameter> parse_query(const UrlContext& context, std::string_view query);

// Typed values of query parameters; each failure names the parameter.
// A whole number in [minimum, maximum]; the bounds keep absurd values (a billion shards) from
// turning into allocation failures or overflows inside a backend.
std::size_t count_value(const UrlContext& context, const QueryParameter& parameter,
                        std::size_t minimum, std::size_t maximum);
bool bool_value(const UrlContext& context, const QueryParameter& parameter);
std::chrono::milliseconds duration_value(const UrlContext& context,
                                         const QueryParameter& parameter);
[[noreturn]] void unknown_parameter(const UrlContext& context, const QueryParameter& parameter,
                                    std::string_view where, std::string_view known);

// Parses and checks `url` as open_recorder / open_store would, opening nothing (no file, no
// connection). Throws what they throw for a bad URL (ConfigError, NotSupported). For tests and
// the URL fuzzer.
enum class OpenFace { recorder, store, outbox };
void check_open_url(std::string_view url, OpenFace face);

}  // namespace idem::detail
