// RedisError: a failure talking to Redis, as an idem StoreError.
//
// Every hiredis failure and every error reply idem meets becomes a RedisError in one place
// (redis_error.cpp), with a RedisFailure saying what went wrong and the two flags retry logic
// reads:
//
//   failure          when                                     retryable  in_doubt
//   connect          connection refused, unreachable, DNS,    yes        no
//                    connect timeout
//   pool_exhausted   every pooled connection stayed busy      yes        no
//                    past RedisOptions::wait_timeout
//   io               reset, closed, or timed out              yes        no    (before the
//                    (RedisOptions::command_timeout)                           command was sent,
//                                                                              or a read)
//                                                             *          yes   (a write that was
//                                                                              sent, reply lost)
//   auth             AUTH or SELECT refused                   no         no
//   tls              the TLS handshake failed: the server's   no         no
//                    certificate is untrusted, expired or
//                    names another host; the server refused
//                    the client certificate; a TLS client
//                    met a plaintext port or a plaintext
//                    client a TLS port
//   protocol         a reply hiredis cannot parse (the        as io      as io
//                    connection is dropped)
//   protocol         a reply of an unexpected shape           no         no
//   reply            the server answered with an error        no         no
//                    (-ERR, -WRONGTYPE, a script error, ...)
//   reply            a transient refusal: -LOADING (restarted, yes        no
//                    still reading its data), -BUSY, -TRYAGAIN,
//                    -CLUSTERDOWN, -MASTERDOWN, -NOREPLICAS,
//                    -READONLY (a replica), -OOM
//
// * A write whose reply was lost may or may not have been applied. It is retryable only where
//   repeating it is harmless (mark_processed and mark_processed_batch: marking twice is a
//   no-op); claims, completions, releases and renewals that are in doubt are not retryable —
//   the caller must find out what happened (lookup, or wait for the lease) before acting again.
//   -NOSCRIPT is never seen by callers: idem sends the script's source and retries once.
//
// A -WRONGTYPE reply (another kind of value under one of idem's keys) has the code
// store_corrupt_record; every other failure has store_error, except auth and tls
// (store_open_failed: the same configuration fails the same way on every try).
//
// Messages name the operation, the endpoint (host:port/db, never the password) and hiredis's or
// the server's own text, e.g.
//   "idem redis: connect to 127.0.0.1:6379/0: Connection refused",
//   "idem redis: connect to localhost:6380/0: TLS: certificate verify failed: certificate has
//    expired",
//   "idem redis: complete on 127.0.0.1:6379/0: Server closed the connection (the server closed
//    the connection); the command was sent and its reply lost: it may or may not have been
//    applied".
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem::redis {

enum class RedisFailure {
  connect,         // no connection could be established
  pool_exhausted,  // no pooled connection became free in time
  io,              // the connection failed (reset, EOF, timeout) during a command
  auth,            // the server refused AUTH or SELECT
  tls,             // the TLS handshake failed, or one side of the connection does not speak TLS
  protocol,        // the reply could not be parsed, or was not what the command returns
  reply,           // the server answered with an error reply
};

// "connect", "pool_exhausted", ...
std::string_view to_string(RedisFailure failure) noexcept;

class RedisError : public StoreError {
 public:
  RedisError(RedisFailure failure, const std::string& message, bool retryable, bool in_doubt,
             bool timed_out = false, ErrorCode code = ErrorCode::store_error)
      : StoreError(code, message, retryable, in_doubt), failure_(failure), timed_out_(timed_out) {}

  RedisFailure failure() const noexcept { return failure_; }
  // The failure was a timeout (connect_timeout or command_timeout), not a refusal or a reset.
  bool timed_out() const noexcept { return timed_out_; }

 private:
  RedisFailure failure_;
  bool timed_out_;
};

}  // namespace idem::redis
