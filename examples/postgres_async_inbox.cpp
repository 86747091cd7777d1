// The coroutine face on PostgreSQL: many deliveries handled at once on ONE thread, each through
// the transactional inbox (the handler's write commits with idem's marker), redeliveries
// dropped, and a blocking recorder in the same program seeing the same markers.
//
//   example_postgres_async_inbox [postgresql://user@host:port/db]
//     (default: $IDEM_TEST_POSTGRES_URL; scripts/servers.sh sets it for a throwaway server)
//
// Everything lives in the schema idem_example_async; each run starts from empty tables.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_recorder.hpp"

namespace {

using idem::async::AsyncSqlTransaction;
using idem::async::Task;

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("IDEM_TEST_POSTGRES_URL");
  idem::postgres::PostgresOptions options;
  options.url = argc > 1 ? argv[1] : (env != nullptr ? env : "");
  options.schema = "idem_example_async";
  if (options.url.empty()) {
    std::cerr << "usage: example_postgres_async_inbox postgresql://user@host:port/db\n";
    return 2;
  }
  try {
    asio::io_context io;
    auto pool = std::make_shared<idem::postgres::AsyncConnectionPool>(io.get_executor(), options);
    idem::postgres::AsyncPostgresRecorder recorder(pool);  // creates the tables (blocking, once)
    const std::string shipments = "\"idem_example_async\".shipments";

    // Set-up through the inbox's own transaction handle: a table for the handler's writes.
    asio::co_spawn(
        io,
        [&]() -> Task<void> {
          co_await recorder.run_transactional(
              "setup", "shipments-table", [&](AsyncSqlTransaction& tx) -> Task<void> {
                co_await tx.exec("CREATE TABLE IF NOT EXISTS " + shipments +
                                 " (order_id text PRIMARY KEY)");
                // A fresh start for the example: no shipments, no markers (this set-up's own
                // marker goes too, so the next run sets up again).
                co_await tx.exec("TRUNCATE " + shipments +
                                 ", \"idem_example_async\".processed_log, "
                                 "\"idem_example_async\".claims");
              });
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
    io.run();

    // 20 orders, each delivered twice, all 40 deliveries in flight at once.
    int shipped = 0;
    int dropped = 0;
    for (int delivery = 0; delivery < 40; ++delivery) {
      asio::co_spawn(
          io,
          [&, delivery]() -> Task<void> {
            const std::string order = "order-" + std::to_string(delivery % 20);
            const bool ran = co_await recorder.run_transactional(
                "warehouse", order, [&](AsyncSqlTransaction& tx) -> Task<void> {
                  const idem::SqlParam params[] = {tx.event_id()};
                  co_await tx.exec("INSERT INTO " + shipments + " (order_id) VALUES ($1)", params);
                });
            ++(ran ? shipped : dropped);
          },
          [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
          });
    }
    io.restart();
    io.run();
    std::cout << "shipped " << shipped << ", dropped " << dropped << " redeliveries\n";

    // A blocking recorder on the same database sees the same markers.
    idem::postgres::PostgresIdempotencyRecorder blocking(options);
    std::cout << "blocking recorder: order-7 processed = " << std::boolalpha
              << blocking.is_processed("warehouse", "order-7") << "\n";
    return shipped == 20 && dropped == 20 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
}
