// postgres_tls: a recorder over a verified TLS connection, the password read from a file.
//
//   * PostgresOptions asks libpq for sslmode=verify-full with the CA file (the server's
//     certificate must be signed by it and name the host connected to), and idem for the
//     password from password_file (so it appears in no URL, log or process listing).
//   * A marker is written and read back.
//   * A failure says whether it is worth retrying: a TLS problem (untrusted or expired
//     certificate, host name mismatch, a server that wants a client certificate) is
//     store_open_failed and not retryable, its message "... TLS: <cause>".
//
// Run (scripts/servers.sh starts such a server and sets the variables):
//   scripts/servers.sh sh -c 'build/default/examples/example_postgres_tls
//     postgresql://idem_tls@localhost:$IDEM_TEST_POSTGRES_TLS_PORT/idem_test
//     $IDEM_TEST_TLS_DIR/ca.crt $IDEM_TEST_TLS_DIR/pg-password'
#include <iostream>
#include <string>

#include "idem/error.hpp"
#include "idem/postgres/postgres_recorder.hpp"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cout
        << "example_postgres_tls: nothing to do without a server.\n"
           "usage: example_postgres_tls postgresql://USER@HOST:PORT/DB CA.pem PASSWORD_FILE\n";
    return 0;
  }
  idem::postgres::PostgresOptions options;
  options.url = argv[1];
  options.sslmode = "verify-full";
  options.sslrootcert = argv[2];
  options.password_file = argv[3];
  options.schema = "idem_example_tls";
  try {
    idem::postgres::PostgresIdempotencyRecorder recorder(options);
    recorder.mark_processed("tls-example", "event-1");
    std::cout << "marked event-1 over TLS; processed: " << std::boolalpha
              << recorder.is_processed("tls-example", "event-1") << "\n";
    return 0;
  } catch (const idem::Error& e) {
    std::cerr << "example_postgres_tls: " << e.code_name()
              << (e.retryable() ? " (retryable)" : " (not retryable)") << ": " << e.message()
              << "\n";
    return 1;
  }
}
