// What idem::http guards and how: routes, the key rules, the principal a key is scoped to, the
// fingerprint, which outcomes are kept and which response fields are stored.
//
//   idem::http::GuardOptions options;
//   options.principal.headers = {"Authorization"};
//   idem::http::Route payments;
//   payments.name = "payments";
//   payments.methods = {"POST"};
//   payments.path = "/v1/payments/*";
//   payments.required = true;                         // 400 without a key
//   payments.fingerprint.body = idem::http::BodyFingerprint::json;
//   payments.policy.while_running = idem::InProgressPolicy::reject;   // 409 at once
//   options.routes.push_back(payments);
//
// Routes are tried in order; the first whose method and path match guards the request. A request
// no route matches passes through unguarded, key or not (a key on GET has no effect, as with
// Stripe). validate() checks everything once (ConfigError naming the route and field); the Guard
// calls it.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <bitset>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "idem/http/key.hpp"
#include "idem/idempotency_policy.hpp"

namespace idem::http {

// A set of status codes 100-599, written as a list of "404", "4xx" or "500-504" items.
class StatusSet {
 public:
  StatusSet() = default;
  // Throws ConfigError naming the item that is not a status, a class or a range.
  StatusSet(std::initializer_list<std::string_view> items);
  static StatusSet parse(const std::vector<std::string>& items);

  bool contains(int status) const noexcept {
    return status >= 0 && status < 600 && bits_.test(static_cast<std::size_t>(status));
  }
  void add(std::string_view item);  // ConfigError as above
  bool empty() const noexcept { return bits_.none(); }

 private:
  std::bitset<600> bits_;
};

// Which part of the body the fingerprint covers.
enum class BodyFingerprint {
  raw,   // the bytes as received
  json,  // the body parsed as JSON and written canonically (member order and whitespace do not
         // count; 1 and 1.0 differ). A body that is not JSON is fingerprinted raw.
  none,  // not at all
};

struct FingerprintOptions {
  BodyFingerprint body = BodyFingerprint::raw;
  // With body == json: only these members (RFC 6901 JSON Pointers, e.g. "/amount"); an absent
  // member counts as absent, apart from null. Empty: the whole document.
  std::vector<std::string> json_pointers;
  // The query string, its parameters sorted (a=1&b=2 equals b=2&a=1).
  bool query = true;
  // These request fields' values (all lines of each, in order), e.g. "Content-Type".
  std::vector<std::string> headers;
};

// Who sent a request, so that a key only ever finds its own sender's records: the store key is
// a digest of the principal, the method, the route, the path and the key. Without a principal
// every client shares one key space, and a guessed key replays another client's response.
struct PrincipalOptions {
  // Request fields naming the client, e.g. "Authorization" or "X-Api-Key": the first present is
  // the principal (its name and value are hashed; they are never stored).
  std::vector<std::string> headers;
  // The verified TLS client certificate's subject (Request::client_subject) when no header names
  // the client.
  bool client_certificate = false;
  // A guarded request without any principal: true answers 400; false scopes it to the anonymous
  // principal, which all such requests share.
  bool required = false;
};

struct Route {
  // Names the route in the key scope, metrics and logs. Default (empty): the path pattern.
  std::string name;
  // Methods guarded (case-sensitive). Default: POST and PATCH, the draft's non-idempotent ones.
  std::vector<std::string> methods = {"POST", "PATCH"};
  // Path pattern, matched against the path normalised (RFC 3986 §6.2.2: percent-encoded
  // unreserved characters decoded, dot segments removed): literal segments, "{name}" for any one
  // segment, and a last segment "*" for any number (zero included). "/*" matches every path.
  std::string path = "/*";
  // true: a request without a key is answered 400. false: it passes through unguarded.
  bool required = false;
  DuplicatePolicy policy{};
  FingerprintOptions fingerprint{};
  // Upstream statuses whose response is released rather than kept (the next request with the key
  // runs again) — transient outcomes. Statuses >= 400 not listed are failures, kept as the policy
  // says (DuplicatePolicy::keep_failures); < 400 are successes.
  StatusSet transient_statuses{"401", "403", "408", "429", "5xx"};
  // Response fields kept with a stored response and replayed (case-insensitive); connection and
  // framing fields never are.
  std::vector<std::string> stored_headers = {
      "Content-Type", "Content-Language", "Content-Encoding", "Location", "ETag", "Last-Modified",
      "Link",         "Cache-Control"};
  // A response body above this many bytes is passed through and its key released.
  std::size_t max_stored_body = 1 << 20;
};

// An in-process cache of replays, so that a duplicate of a completed key is answered without a
// store round trip. Off by default (max_entries == 0). It holds only what the guard itself just
// replayed from the store (never a refusal, a mismatch, a released key, or a route whose
// after_finished would not replay it), keyed by the full store key, with the record's
// fingerprint, the replay and the record's expiry. An entry answers (the same replay, or the same
// 422 for another fingerprint) while the record has not expired and for at most max_age after
// it was read from the store: a record removed from the store (idem store remove, purge) or
// changed by another process can still be replayed by this guard for up to max_age.
// Least recently used entries go first once max_entries or max_bytes is reached.
struct ReplayCacheOptions {
  std::size_t max_entries = 0;       // 0: off
  std::size_t max_bytes = 64 << 20;  // keys, fingerprints and responses together; > 0 when on
  Millis max_age = std::chrono::seconds(1);  // > 0 when on, at most 1 hour
};

struct GuardOptions {
  // Tried in order. Empty: one default Route (POST and PATCH on every path, key optional).
  std::vector<Route> routes;
  KeyRules key{};
  PrincipalOptions principal{};
  // Problem types (RFC 9457 "type") are problem_base + a code ("key-missing", ...), e.g.
  // "https://api.example.com/problems/". Empty: "about:blank", the title then the status's
  // phrase and the code in a "code" member.
  std::string problem_base;
  // Prepended to every store key, so several guards (or services) can share one store.
  std::string key_prefix = "http:";
  ReplayCacheOptions replay_cache{};
};

// Throws ConfigError naming the route (by name or index) and the field for anything unusable:
// an empty or malformed path pattern, no methods, a method that is not a token, a bad JSON
// pointer, key lengths out of order or above 4096, a policy out of range, a replay cache that is
// on with a max_bytes of zero or a max_age outside (0, 1h].
void validate(const GuardOptions& options);

// The options with defaults filled in (an empty route list gets the default route, an empty
// route name the path pattern), validated.
GuardOptions normalized(GuardOptions options);

}  // namespace idem::http
