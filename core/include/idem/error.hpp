// idem errors.
//
// Every error idem throws derives from idem::Error (itself a std::runtime_error). Each carries:
//   * code()      — a stable machine-readable code (ErrorCode, name via code_name()),
//   * retryable() — trying the same call again later may succeed (a busy database, a lost
//                   connection, a duplicate that is still in progress),
//   * in_doubt()  — the write may or may not have happened (a commit whose outcome is unknown).
//                   Retry logic must not blindly re-run an operation whose outcome is in doubt.
//
// Expected outcomes — a duplicate delivery, an already completed key — are return values, not
// exceptions. AlreadyInProgress is the one exception to that rule: it is thrown out of a handler
// so that the transport does not acknowledge the delivery and redelivers it later.
//
// Thread-safety: error objects are immutable after construction; copies may be used freely.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idem {

// Stable error codes. Values never change meaning; new codes are only appended.
enum class ErrorCode {
  invalid_argument,          // bad input to an idem call (empty name, NUL byte, bad option)
  invalid_key,               // an idempotency key / event id / consumer name failed validation
  config_error,              // contradictory or unusable options
  store_error,               // a store/recorder backend failed (see retryable()/in_doubt())
  store_open_failed,         // the store could not be opened (path, permissions)
  store_not_a_database,      // the file exists but is not a database of the expected kind
  store_read_only,           // the store refuses writes
  store_busy,                // the store stayed locked past its busy timeout
  store_corrupt_record,      // a stored record could not be decoded
  already_in_progress,       // another delivery/call holds the claim right now
  reentry,                   // the owner of a key called the same key while running it
  key_reuse,                 // a key was reused with different arguments (fingerprint mismatch)
  timeout,                   // an attempt exceeded its deadline
  circuit_open,              // the circuit breaker rejected the call
  validation_failed,         // a result validator rejected the result
  fallback_chain_failed,     // every fallback failed
  operation_failed,          // the resilient operation failed (carries the report)
  cancelled,                 // the caller's stop token was triggered
  decode_error,              // a Codec could not decode stored bytes
  not_supported,             // the backend does not support the requested mode
  rate_limit_wait_exceeded,  // a rate limit asked for a longer wait than max_rate_limit_wait
  retry_after_extraction_failed,  // the retry-after extractor threw or returned a bad delay
  store_replaced,                 // the store's file was deleted or replaced while open (reopen it)
  store_corrupt,                  // the store's file is damaged (SQLite: SQLITE_CORRUPT)
  host_not_found,      // a server's host name does not resolve (retryable only when the resolver
                       // could not answer now)
  connection_refused,  // nothing listens at the server's address and port (retryable)
  connect_timeout,     // no connection, or no first answer, within the connect timeout (retryable)
  wrong_protocol,      // something else answers at the address: not Redis, PostgreSQL or AMQP
  broker_error,        // the message broker (RabbitMQ) failed (see retryable()/in_doubt())
};

// The stable name of a code, e.g. "store_busy".
std::string_view code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, bool retryable = false, bool in_doubt = false);

  ErrorCode code() const noexcept { return code_; }
  std::string_view code_name() const noexcept { return idem::code_name(code_); }
  bool retryable() const noexcept { return retryable_; }
  bool in_doubt() const noexcept { return in_doubt_; }
  // The message without the "idem: <code>: " prefix that what() carries: for an error that
  // wraps another (`SomeError(e.message() + hint)`), so the prefix is never repeated.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
  ErrorCode code_;
  bool retryable_;
  bool in_doubt_;
};

// Bad input to an idem call. Never retryable: the same input fails again.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message, ErrorCode code = ErrorCode::invalid_argument)
      : Error(code, message) {}
};

// A key, event id or consumer name that failed validation (empty, too long, NUL byte, ...).
class InvalidKey : public InvalidArgument {
 public:
  explicit InvalidKey(const std::string& message)
      : InvalidArgument(message, ErrorCode::invalid_key) {}
};

// Contradictory or unusable options, reported at construction.
class ConfigError : public InvalidArgument {
 public:
  explicit ConfigError(const std::string& message)
      : InvalidArgument(message, ErrorCode::config_error) {}
};

// A backend failure. The backend sets retryable()/in_doubt() to say what the caller may do.
class StoreError : public Error {
 public:
  StoreError(ErrorCode code, const std::string& message, bool retryable = false,
             bool in_doubt = false)
      : Error(code, message, retryable, in_doubt) {}
  explicit StoreError(const std::string& message, bool retryable = false, bool in_doubt = false)
      : Error(ErrorCode::store_error, message, retryable, in_doubt) {}
};

// The requested mode is not available on this backend (e.g. transactional on memory).
class NotSupported : public Error {
 public:
  explicit NotSupported(const std::string& message) : Error(ErrorCode::not_supported, message) {}
};

// Another delivery or call holds the claim on this key right now. Retryable: deliver the event
// again later (it will then be dropped as processed, or run if the holder gave up).
class AlreadyInProgress : public Error {
 public:
  explicit AlreadyInProgress(const std::string& message)
      : Error(ErrorCode::already_in_progress, message, /*retryable=*/true) {}
};

// Bytes that do not decode as the type asked for: a Codec's stored result, an event's payload,
// a stored execution report or HTTP response. Not a StoreError: the store answered, and another
// attempt would read the same bytes (not retryable). A row a backend cannot read as a record at
// all (unknown state, broken framing) is a StoreError with code store_corrupt_record instead.
class DecodeError : public Error {
 public:
  explicit DecodeError(const std::string& message) : Error(ErrorCode::decode_error, message) {}
};

// The owner of an idempotency key called the same key again while running it. Waiting would
// deadlock, so idem refuses.
class ReentryError : public Error {
 public:
  ReentryError(const std::string& key, const std::string& message)
      : Error(ErrorCode::reentry, message), key_(key) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

// A key was reused with arguments whose fingerprint differs from the first call's. The call did
// not run. (IETF Idempotency-Key draft: 422.) The message names the operation, the key, and the
// claim that holds it (its fencing token, and when it started or until when its lease runs).
class KeyReuseError : public Error {
 public:
  KeyReuseError(const std::string& key, const std::string& message, std::string operation = {})
      : Error(ErrorCode::key_reuse, message), key_(key), operation_(std::move(operation)) {}
  // The caller's key (as its key function returned it, not the scoped key the store holds).
  const std::string& key() const noexcept { return key_; }
  // The operation's name; empty when the coordinator was called without one.
  const std::string& operation() const noexcept { return operation_; }

 private:
  std::string key_;
  std::string operation_;
};

// An attempt, or a caller's wait, exceeded its deadline. Retryable: the dependency may answer
// in time on another try. (Whether the timed-out work still ran is unknown to idem.)
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message,
                        std::optional<std::chrono::nanoseconds> timeout = std::nullopt,
                        std::shared_ptr<const void> attempt = nullptr,
                        bool (*attempt_ended)(const void*) = nullptr)
      : Error(ErrorCode::timeout, message, /*retryable=*/true),
        timeout_(timeout),
        attempt_(std::move(attempt)),
        attempt_ended_(attempt_ended) {}

  // The timeout that was exceeded (an attempt's), or nullopt for a caller's wait deadline.
  std::optional<std::chrono::nanoseconds> timeout() const noexcept { return timeout_; }
  // Whether the timed-out attempt has ended by now (it ran on and was asked to stop; a callable
  // that takes a std::stop_token may have honoured that). Nullopt when no attempt is behind this
  // error. Safe to call from any thread, any number of times.
  std::optional<bool> attempt_stopped() const noexcept {
    if (!attempt_ || attempt_ended_ == nullptr) return std::nullopt;
    return attempt_ended_(attempt_.get());
  }

 private:
  std::optional<std::chrono::nanoseconds> timeout_;
  std::shared_ptr<const void> attempt_;
  bool (*attempt_ended_)(const void*) = nullptr;
};

// A rate-limited failure whose wait (the provider's Retry-After, or the backoff) is longer than
// the operation accepts (max_rate_limit_wait): the retries end at once with this error, which
// nests the rate-limited failure. Retryable: the caller may try again after retry_after().
class RateLimitWaitExceeded : public Error {
 public:
  RateLimitWaitExceeded(const std::string& message, std::chrono::nanoseconds wait,
                        std::chrono::nanoseconds max_wait, std::exception_ptr rate_limit_error)
      : Error(ErrorCode::rate_limit_wait_exceeded, message, /*retryable=*/true),
        wait_(wait),
        max_wait_(max_wait),
        rate_limit_error_(std::move(rate_limit_error)) {}

  // The wait the retry would have needed.
  std::chrono::nanoseconds retry_after() const noexcept { return wait_; }
  std::chrono::nanoseconds max_wait() const noexcept { return max_wait_; }
  // The rate-limited failure itself (e.g. the HTTP 429).
  std::exception_ptr rate_limit_error() const noexcept { return rate_limit_error_; }

 private:
  std::chrono::nanoseconds wait_;
  std::chrono::nanoseconds max_wait_;
  std::exception_ptr rate_limit_error_;
};

// The retry-after extractor threw, or returned a negative delay, for a rate-limited failure. No
// retry follows (an untrusted delay is never waited out). Not retryable.
class RetryAfterExtractionError : public Error {
 public:
  RetryAfterExtractionError(const std::string& message, std::exception_ptr rate_limit_error,
                            std::exception_ptr cause)
      : Error(ErrorCode::retry_after_extraction_failed, message),
        rate_limit_error_(std::move(rate_limit_error)),
        cause_(std::move(cause)) {}

  // The rate-limited failure the extractor was given.
  std::exception_ptr rate_limit_error() const noexcept { return rate_limit_error_; }
  // What the extractor threw; null when it returned a bad value.
  std::exception_ptr cause() const noexcept { return cause_; }

 private:
  std::exception_ptr rate_limit_error_;
  std::exception_ptr cause_;
};

// The caller's stop token was triggered while it waited.
class Cancelled : public Error {
 public:
  explicit Cancelled(const std::string& message) : Error(ErrorCode::cancelled, message) {}
};

}  // namespace idem
