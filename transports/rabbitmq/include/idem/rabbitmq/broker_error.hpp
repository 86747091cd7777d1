// BrokerError: a failure talking to RabbitMQ, as an idem Error.
//
//   what happened                                     retryable  in_doubt
//   connect refused / timed out / login refused(*)    yes        no    (codes below)
//   the connection or channel was lost, the broker    yes        no    (nothing was sent, or a
//   closed it (restart: CONNECTION_FORCED)                             consume/ack was lost)
//   a publish was sent but its confirm never came     yes        yes   (the broker may have
//   (connection lost, confirm timeout)                                 stored it: publishing
//                                                                      again can duplicate it —
//                                                                      harmless for idem
//                                                                      consumers, which dedup
//                                                                      on the event id)
//   the broker nacked a publish                       yes        no
//   the broker refused a declare/bind (406            no         no
//   PRECONDITION_FAILED: an existing queue or
//   exchange with other settings, 403, 404, ...)
//
//   TLS set-up failed (untrusted or expired          no         no    code store_open_failed
//   certificate, host name mismatch, refused client
//   certificate, amqps:// to a plain port, a plain
//   amqp:// to a TLS port)
//
// (*) RabbitMQ answers bad credentials by closing the socket during the handshake, which looks
//     the same as a broker that is still starting, so a refused login is retryable too: a
//     consumer with a wrong password retries until max_reconnect_attempts (0: forever).
// The code is broker_error, except where a connection could not be made, which a probe of the
// address names (on the failure path only): host_not_found (the name does not resolve),
// connection_refused (nothing listens there), connect_timeout (no connection, or a listener
// that does not answer the AMQP header), wrong_protocol (something else answers: not a broker,
// not retryable); and TLS failures (store_open_failed, message "... TLS: <cause>"). Messages
// name the operation and the endpoint (never the password), e.g.
//   "idem rabbitmq: connect to amqp://guest@127.0.0.1:1/: connection refused: nothing listens
//    at 127.0.0.1:1 (is the broker running, on this port?)".
//
// Thread-safety: immutable after construction.
#pragma once

#include <string>

#include "idem/error.hpp"

namespace idem::rabbitmq {

class BrokerError : public Error {
 public:
  BrokerError(const std::string& message, bool retryable, bool in_doubt = false,
              ErrorCode code = ErrorCode::broker_error)
      : Error(code, message, retryable, in_doubt) {}
};

}  // namespace idem::rabbitmq
