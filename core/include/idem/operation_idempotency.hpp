// The idempotency settings of a resilient operation.
//
// With a key function set, every call computes key(args...) and runs through the
// IdempotencyCoordinator of the chosen store (idempotency.hpp): the first caller executes the
// whole resilience lifecycle (breaker, retries, timeouts, validation, fallbacks) once; callers
// with the same key meanwhile join it and get its value or its exception; later callers replay
// the successful result for `ttl` (counted from completion) with the original report. Failures
// are never cached. A caller that joins or replays never starts retries, fallbacks or breaker
// checks of its own — a replay succeeds even while the breaker is open.
//
// `fingerprint` detects a key reused with different arguments: same key, different fingerprint
// → idem::KeyReuseError naming the operation and the caller's key, and nothing runs (IETF
// Idempotency-Key draft: 422). It is on by default whenever idem::fingerprint can encode every
// argument (strings, numbers, bool, enums, std::optional, nlohmann::json, types with to_json or
// an idem::Codec<T>; fingerprint.hpp); an operation with an argument it cannot encode keeps no
// fingerprint. `false` turns it off (arguments that carry noise, such as a timestamp
// or a trace id), `true` requires it (ConfigError when an argument cannot be encoded), and a
// function of the arguments fingerprints what it returns (e.g. only the fields that matter).
//
// Keys are scoped per operation. The key a store sees is scoped_idempotency_key(scope, key), with
// the scope defaulting to the operation's name, so two operations never replay each other's
// results even when their key functions return the same text. Operations that should share
// results name the same `scope` explicitly; an empty scope means the unscoped key space.
//
// idem::resilient takes these as flat `idempotency_*` fields of ResilientOptions;
// idem::operation(...).with_idempotency(IdempotencyOptions<Sig>{...}) takes this struct.
//
// Thread-safety: plain values; the functions are called concurrently and must be safe so.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "idem/clock.hpp"
#include "idem/detail/callable_traits.hpp"
#include "idem/idempotency.hpp"
#include "idem/idempotency_store.hpp"

namespace idem {

// The key a store holds for `key` in `scope`: "<bytes of scope>:<scope>:<key>", e.g.
// scoped_idempotency_key("create_payment", "request-123") == "14:create_payment:request-123".
// The length prefix makes the split unambiguous whatever bytes the scope holds. An empty scope
// leaves the key unchanged. This format is stable: processes and versions sharing a durable
// store agree on it. The result must pass validate_key (at most 255 bytes), so a scope of S bytes
// leaves 255 - S - 2 - digits(S) bytes for the key; the engine throws InvalidKey naming both when
// it does not fit.
std::string scoped_idempotency_key(std::string_view scope, std::string_view key);

// A stored key split back into its scope and the key the operation's function returned.
struct ScopedIdempotencyKey {
  std::string_view scope;
  std::string_view key;
};
// The inverse of scoped_idempotency_key for a scoped key ("14:create_payment:request-123" →
// {"create_payment", "request-123"}); nullopt for a key not in that form (an unscoped key, or
// one written by another program). Views into `stored`.
std::optional<ScopedIdempotencyKey> split_scoped_idempotency_key(std::string_view stored) noexcept;

template <class Signature>
class IdempotencyFingerprint;

// Automatic by default: idem::fingerprint(args...) when every argument can be encoded, else none.
// `true` always idem::fingerprint(args...), `false` never, a function of the arguments returning
// a string that string.
template <class R, class... Params>
class IdempotencyFingerprint<R(Params...)> {
 public:
  using Function = std::function<std::string(detail::ConstArg<Params>...)>;

  IdempotencyFingerprint() = default;
  IdempotencyFingerprint(bool use_default)  // NOLINT: implicit
      : mode_(use_default ? Mode::required : Mode::off) {}
  template <class F>
  requires(std::is_invocable_r_v<std::string, const F&, detail::ConstArg<Params>...> &&
           !std::same_as<std::remove_cvref_t<F>, bool>) IdempotencyFingerprint(F fn)
      : function_(std::move(fn)) {  // NOLINT: implicit on purpose
    mode_ = function_ ? Mode::function : Mode::off;
  }

  // Asked for explicitly (`true` or a function): needs an idempotency key.
  bool enabled() const noexcept { return mode_ == Mode::required || mode_ == Mode::function; }
  // `true`: idem::fingerprint(args...), which must be able to encode every argument.
  bool uses_default() const noexcept { return mode_ == Mode::required; }
  // Not configured: idem::fingerprint(args...) when it can encode every argument, else none.
  bool is_automatic() const noexcept { return mode_ == Mode::automatic; }
  const Function& function() const noexcept { return function_; }

 private:
  enum class Mode { automatic, required, off, function };
  Mode mode_ = Mode::automatic;
  Function function_{};
};

// `Store` is the face's store protocol: IdempotencyStore here, idem::async::AsyncStore for
// idem::async::operation (idem::async::IdempotencyOptions<Sig>).
template <class Signature, class Store = IdempotencyStore>
struct IdempotencyOptions;

template <class R, class... Params, class Store>
struct IdempotencyOptions<R(Params...), Store> {
  using KeyFunction = std::function<std::string(detail::ConstArg<Params>...)>;

  // The key of a call, from its arguments. Required. At most 255 bytes together with the scope
  // prefix (see scoped_idempotency_key), no control characters.
  KeyFunction key{};
  // The namespace of this operation's keys. Default (unset): the operation's name; an unnamed
  // resilient() gets a scope of its own in memory and must be named (or given a scope) for a
  // store that needs bytes. Operations with the same scope share results; "" is the unscoped key
  // space (keys stored as they are).
  std::optional<std::string> scope{};
  // How long a success is replayed, from completion. Positive. Default 1 h.
  Millis ttl = std::chrono::hours(1);
  // Where records live. Default (null): the process-wide in-memory store.
  std::shared_ptr<Store> store{};
  // Detect a key reused with different arguments. Default: on when idem::fingerprint can encode
  // every argument; `false` turns it off (see the top of this file).
  IdempotencyFingerprint<R(Params...)> fingerprint{};
  // A caller finding the key in progress in another process waits or is rejected. Default wait.
  InProgressPolicy in_progress = InProgressPolicy::wait;
  // The longest such a caller waits before AlreadyInProgress. >= 0. Default 30 s.
  Millis max_wait = std::chrono::seconds(30);
  // The owner's lease, renewed while it runs. Positive. Default 30 s.
  Millis lease = std::chrono::seconds(30);
};

}  // namespace idem
