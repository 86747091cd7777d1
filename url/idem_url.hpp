// Internal, never installed: the one URL toolkit behind every URL idem parses itself —
// open_recorder / open_store (open/), RedisOptions::from_url (backends/redis) and
// rabbitmq::ConnectionOptions::from_url (transports/rabbitmq). It splits a URL into scheme,
// authority (user info, host or [IPv6], port), path and query, %-decodes, reads typed query
// values and redacts the secrets a URL holds. Each user says how a failure reads (UrlErrors); the
// parts, the checks and the words of the problems are the same for all.
//
// The sources are compiled into each library that uses them (url/CMakeLists.txt), with hidden
// visibility: no idem library exports them and no installed target depends on them.
//
// Why not a URL library (liburiparser): "sqlite:relative/path", "sqlite::memory:" and the host
// lists of redis+cluster:// are not the hierarchical URLs such libraries model, and every message
// here must name the part in the URL's words without quoting a password.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::detail {

// How a parser's failures read. `part` names what is wrong ("port", "query parameter 'shards'"),
// `problem` says what ("is empty", "must be 1..65535, got '0'"); problems are written to follow
// the part. Each user words the whole message its own way: idem::open "<part>: <problem> (URL
// '<redacted>')", RedisOptions "redis URL: <part> <problem>", the RabbitMQ transport "idem
// rabbitmq: bad AMQP URL '<redacted>': <part> <problem>". No part or problem ever quotes a
// password.
class UrlErrors {
 public:
  virtual ~UrlErrors() = default;
  // Throws what throw_error throws (ConfigError); never returns.
  [[noreturn]] void fail(std::string_view part, std::string_view problem) const {
    throw_error(part, problem);
    std::abort();  // throw_error returned: a broken UrlErrors
  }

 protected:
  // Words the message and throws it; must not return.
  virtual void throw_error(std::string_view part, std::string_view problem) const = 0;
};

// ---- scheme ------------------------------------------------------------------------------------

// The URL split at its first ':'.
struct SplitUrl {
  std::string scheme;     // lower case
  std::string_view rest;  // everything after "scheme:"
};
// Fails when the scheme is missing or malformed (not a letter followed by letters, digits, '+',
// '-' or '.'); `expected` lists the schemes the caller takes, for the message ("amqp:// or
// amqps://"). Whether the scheme is one of them is the caller's check.
SplitUrl split_scheme(const UrlErrors& errors, std::string_view url, std::string_view expected);

// ---- "//authority/path?query" ------------------------------------------------------------------

struct UrlLocation {
  std::string_view authority;  // between "//" and the path: user info and host(s), not decoded
  std::string_view path;       // "" or from its '/' on, not decoded
  std::string_view query;      // after the '?', not decoded
};
// Splits what follows "scheme:". Fails when it does not start with "//" (`example` shows a good
// URL: "redis://localhost:6379/0") or holds a fragment ('#').
UrlLocation split_location(const UrlErrors& errors, std::string_view rest,
                           std::string_view example);

struct UserInfo {
  std::string user;                     // %-decoded, may be empty (":password@")
  std::optional<std::string> password;  // %-decoded; nullopt without ':' ("user@")
};
struct Authority {
  std::optional<UserInfo> user_info;  // nullopt without '@'
  std::string_view hosts;             // after the last '@': "host[:port]" (or a list, by ',')
};
// Splits the user info off at the authority's last '@' (a password may hold an unescaped '@').
Authority split_authority(const UrlErrors& errors, std::string_view authority);

struct HostPort {
  std::string host;         // %-decoded, without the brackets of an IPv6 address
  std::optional<int> port;  // 1..65535, when given
};
// "host", "host:port", "[ipv6]" or "[ipv6]:port". Fails on a missing host, a missing ']', text
// after ']', a '[' or ']' elsewhere, an empty port, a port that is not a number in 1..65535.
HostPort parse_host_port(const UrlErrors& errors, std::string_view text);

// ---- %-decoding --------------------------------------------------------------------------------

// "%41" -> "A". `part` names what is decoded, for the message, which quotes an offset, never the
// text (it may be a password). A malformed escape or a NUL byte (%00) fails.
std::string percent_decode(const UrlErrors& errors, std::string_view text, std::string_view part);

// %-decodes without failing (a malformed escape is kept as written): for finding secrets.
std::string lenient_percent_decode(std::string_view text);

// ---- query -------------------------------------------------------------------------------------

struct QueryParameter {
  std::string name;      // %-decoded
  std::string value;     // %-decoded
  std::string_view raw;  // "name=value" as written
};
// "a=1&b=2" -> parameters. Empty pairs ("a=1&&b=2", a trailing '&') are skipped; a pair without
// '=', a parameter without a name or a name given twice fails.
std::vector<QueryParameter> parse_query(const UrlErrors& errors, std::string_view query);

// "query parameter '<name>'": how messages name a parameter.
std::string parameter_part(const QueryParameter& parameter);

// Typed values of query parameters; each failure names the parameter.
// A whole number in [minimum, maximum]; the bounds keep absurd values (a billion shards) from
// turning into allocation failures or overflows inside a backend.
std::size_t count_value(const UrlErrors& errors, const QueryParameter& parameter,
                        std::size_t minimum, std::size_t maximum);
// A whole number written in digits, at most `maximum`, for settings whose range the options
// struct checks: "<part> must be a non-negative integer, got '<text>'".
std::uint64_t whole_number(const UrlErrors& errors, std::string_view part, std::string_view text,
                           std::uint64_t maximum = std::numeric_limits<std::uint64_t>::max());
// true, false, 1 or 0.
bool bool_value(const UrlErrors& errors, const QueryParameter& parameter);
// Fails: "<parameter> must be a, b or c, got '<its value>'" (`names` in that order).
[[noreturn]] void not_a_choice(const UrlErrors& errors, const QueryParameter& parameter,
                               const std::vector<std::string_view>& names);
// The value paired with the parameter's value among `choices` (name, value), e.g.
// choice_value<Durability>(errors, parameter, {{"full", Durability::full}, ...}); any other
// value fails (not_a_choice).
template <class T>
T choice_value(const UrlErrors& errors, const QueryParameter& parameter,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::vector<std::string_view> names;
  for (const auto& [name, value] : choices) {
    if (parameter.value == name) return value;
    names.push_back(name);
  }
  not_a_choice(errors, parameter, names);
}
// The duration grammar of every idem URL (idem/duration.hpp: 500ms, 30s, ...; at most 1000d).
std::chrono::milliseconds duration_value(const UrlErrors& errors, const QueryParameter& parameter);
// Fails: "query parameter '<name>' is not known for <where> (known: <known>)".
[[noreturn]] void unknown_parameter(const UrlErrors& errors, const QueryParameter& parameter,
                                    std::string_view where, std::string_view known);

// ---- secrets -----------------------------------------------------------------------------------

// Where `url` holds secrets, as sorted [first, last) offsets: the user info's password, and the
// values of password= and sslpassword= query parameters (any case, %-encoded or not). Lenient:
// it reads malformed URLs too ("redis:u:pw@host", a "//" forgotten; "user:pw@host", no scheme),
// where covering too much is harmless and too little is not.
std::vector<std::pair<std::size_t, std::size_t>> url_secret_spans(std::string_view url);

// `url` with every secret of url_secret_spans replaced by "***" (nothing else changed: no
// escaping, no cut).
std::string redact_url_secrets(std::string_view url);

}  // namespace idem::detail
