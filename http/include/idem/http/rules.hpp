// The store-free half of idem::http: what a request is before any store is asked.
//
// inspect() matches the route, parses the key, finds the principal and computes the store key
// and the fingerprint — or says why the request is refused (400) or passes unguarded. The Guard
// (guard.hpp) calls it first; tests and fuzzers call it alone.
//
//   store key   = key_prefix + SHA-256(route name, method, normalised path, principal, key)
//   fingerprint = SHA-256(body part, query part, chosen fields)       (both lowercase hex)
//
// The principal and the key reach the store only inside the digest, so neither a bearer token
// nor a key is ever written there, and the digest always fits the store's key limit.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/http/message.hpp"
#include "idem/http/options.hpp"
#include "idem/idempotency_policy.hpp"

namespace idem::http {

// Why idem::http answered a request itself instead of forwarding it.
enum class Refusal {
  key_missing,           // 400: the route requires a key and none came
  key_invalid,           // 400: not an sf-string, or against the key rules
  key_repeated,          // 400: more than one key field
  principal_missing,     // 400: PrincipalOptions::required and no principal
  fingerprint_mismatch,  // 422: the key was first used with another request
  in_progress,           // 409: the key's first request still runs (reject policy, or max_wait)
  key_spent,             // 409: the key was used and the route's policy is after_finished = reject
  store_unavailable,     // 503: the store could not be asked
};

// "key-missing", "key-invalid", ... (the problem type's code).
std::string_view to_string(Refusal refusal) noexcept;
// 400, 409, 422 or 503.
int status_of(Refusal refusal) noexcept;

// A request a route guards, ready for the store.
struct GuardedRequest {
  const Route* route = nullptr;  // into the GuardOptions inspected
  std::string store_key;         // key_prefix + 64 hex digits
  std::string fingerprint;       // 64 hex digits
  // The first 16 hex digits of the digest: names the key in logs and metrics without revealing it.
  std::string key_digest;
};

struct Inspection {
  enum class Kind {
    pass,     // no route guards it (or an optional route got no key): forward, no claim
    refuse,   // answer `refusal` (400)
    guarded,  // `guarded` is set: claim the key
  };
  Kind kind = Kind::pass;
  Refusal refusal = Refusal::key_missing;
  std::string detail;            // refuse: what is wrong
  const Route* route = nullptr;  // the matching route (pass and refuse may have one too)
  GuardedRequest guarded;
};

// `options` must be normalized() (the Guard's are). Never throws for any request.
Inspection inspect(const GuardOptions& options, const Request& request);

// The path of `target` normalised for route matching (RFC 3986 §6.2.2): the query and fragment
// cut, an absolute-form target's scheme and authority dropped, %XX of unreserved characters
// decoded, other %xx upper-cased, dot segments removed. nullopt when the target is not a path
// ("*", empty, a bad %-escape, a control or non-ASCII byte).
std::optional<std::string> normalize_path(std::string_view target);

// Whether `pattern` (Route::path) matches the normalised `path`.
bool path_matches(std::string_view pattern, std::string_view path) noexcept;

// An RFC 9457 problem+json response: {"type", "title", "status", "detail"} (and "code" when the
// type is about:blank), Content-Type application/problem+json. 409 and 503 carry Retry-After: 1.
Response problem(const GuardOptions& options, Refusal refusal, std::string_view detail);

// The kind of an upstream outcome on `route`: transient when its status is in
// transient_statuses, failure for other statuses >= 400, success below.
OutcomeKind outcome_of(const Route& route, int status) noexcept;

// A response kept in the store: its status, the route's stored_headers (nothing else) and its
// body, and the outcome kind, in a versioned binary layout.
std::string encode_stored(const Route& route, const Response& response, OutcomeKind kind);
struct StoredResponse {
  Response response;
  OutcomeKind kind = OutcomeKind::success;
};
// Throws DecodeError for bytes that are not encode_stored() output.
StoredResponse decode_stored(std::string_view bytes);

// An HTTP date (IMF-fixdate, RFC 9110 §5.6.7): "Sun, 06 Nov 1994 08:49:37 GMT".
std::string http_date(WallTime time);

// The response fields idem::http adds.
inline constexpr std::string_view kReplayedField = "Idempotent-Replayed";  // "true" on a replay
inline constexpr std::string_view kExpiresField =
    "Idempotency-Key-Expires";  // when a kept outcome stops answering

}  // namespace idem::http
