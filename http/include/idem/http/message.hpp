// The HTTP request and response idem::http decides about, independent of any server framework.
//
// A framework adapter (the `idem proxy` server, the cpp-httplib middleware in
// examples/http_middleware.cpp) copies what idem needs into a Request — method, target, header
// fields, the whole body — and turns a Response back into its own. Framing (Content-Length,
// Transfer-Encoding) and connection management (Connection, Keep-Alive) stay the adapter's:
// idem never stores or replays them.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::http {

struct Header {
  std::string name;   // as received; compared without regard to ASCII case
  std::string value;  // leading and trailing whitespace already removed
};
using Headers = std::vector<Header>;

struct Request {
  std::string method;  // "POST" (case-sensitive, RFC 9110 §9.1)
  std::string target;  // origin-form "/path?query" (absolute-form is accepted too)
  Headers headers;     // every field line, in order (a repeated field is several entries)
  std::string body;    // the whole body, de-chunked
  // The subject of the client's TLS certificate, when the adapter verified one (the principal
  // of PrincipalOptions::client_certificate).
  std::optional<std::string> client_subject;
};

struct Response {
  int status = 200;
  Headers headers;  // no framing or hop-by-hop fields (the adapter adds its own)
  std::string body;
};

// ASCII case-insensitive comparison of field names.
bool iequals(std::string_view a, std::string_view b) noexcept;

// The value of the first field named `name`, if any.
std::optional<std::string_view> find_header(const Headers& headers, std::string_view name);
// How many field lines are named `name`.
std::size_t count_headers(const Headers& headers, std::string_view name);
// Adds a field (another line with the name if one exists).
void add_header(Headers& headers, std::string name, std::string value);
// Replaces every field named `name` with one line holding `value`.
void set_header(Headers& headers, std::string_view name, std::string value);
// Removes every field named `name`.
void remove_header(Headers& headers, std::string_view name);

// Fields that describe one connection or the message's framing (RFC 9110 §7.6.1, RFC 9112 §6):
// Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade,
// Content-Length. A proxy never forwards them as they are, and idem never stores them.
bool is_connection_field(std::string_view name) noexcept;

// "OK", "Not Found", ...; "" for a status without a registered phrase.
std::string_view reason_phrase(int status) noexcept;

}  // namespace idem::http
