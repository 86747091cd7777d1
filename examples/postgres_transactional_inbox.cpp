// The transactional inbox on PostgreSQL: a handler whose own writes commit in the same
// transaction as idem's "processed" marker, so a crash, a lost connection or an exception leaves
// both or neither.
//
//   example_postgres_transactional_inbox [postgresql://user@host:port/db]
//     (default: $IDEM_TEST_POSTGRES_URL; scripts/servers.sh sets it for a throwaway server)
//
// A warehouse consumer receives "order.paid" events at least once. For each, it books a
// shipment row and takes the item out of stock, in the database that also holds the markers.
// Everything lives in a schema of its own, dropped at the end.
#if __has_include(<libpq-fe.h>)
#include <libpq-fe.h>
#else
#include <postgresql/libpq-fe.h>  // Debian's location, when the include dir is not on the path
#endif

#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/postgres/postgres_recorder.hpp"

namespace {

// Plain libpq, as any other program using the database would: the warehouse's own tables, and
// a look at them after each delivery.
class Sql {
 public:
  explicit Sql(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      throw std::runtime_error(std::string("cannot connect: ") + PQerrorMessage(conn_));
    }
    PQsetNoticeProcessor(
        conn_, [](void*, const char*) {}, nullptr);
  }
  ~Sql() { PQfinish(conn_); }
  Sql(const Sql&) = delete;
  Sql& operator=(const Sql&) = delete;

  std::string operator()(const std::string& sql) {
    PGresult* result = PQexec(conn_, sql.c_str());
    const ExecStatusType status = PQresultStatus(result);
    std::string value;
    if (status == PGRES_TUPLES_OK && PQntuples(result) > 0) value = PQgetvalue(result, 0, 0);
    const std::string error = PQresultErrorMessage(result);
    PQclear(result);
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) throw std::runtime_error(error);
    return value;
  }

 private:
  PGconn* conn_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* env_url = std::getenv("IDEM_TEST_POSTGRES_URL");
  const std::string url = argc > 1 ? argv[1] : (env_url != nullptr ? env_url : "");
  if (url.empty()) {
    std::cerr << "usage: example_postgres_transactional_inbox postgresql://user@host:port/db\n"
                 "  (or set IDEM_TEST_POSTGRES_URL; scripts/servers.sh starts a server)\n";
    return 2;
  }
  const std::string schema = "idem_example_" + idem::new_event_id().substr(0, 8);
  Sql sql(url);

  idem::postgres::PostgresOptions options;
  options.url = url;
  options.schema = schema;  // idem creates it with its tables
  auto recorder = std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options);
  sql("CREATE TABLE " + schema + ".shipments (order_id text PRIMARY KEY, sku text NOT NULL)");
  sql("CREATE TABLE " + schema + ".stock (sku text PRIMARY KEY, units integer NOT NULL)");
  sql("INSERT INTO " + schema + ".stock VALUES ('kettle', 10)");
  const auto show = [&] {
    std::cout << "    kettles in stock: " << sql("SELECT units FROM " + schema + ".stock")
              << ", shipments: " << sql("SELECT count(*) FROM " + schema + ".shipments")
              << ", markers: "
              << sql("SELECT count(*) FROM " + schema +
                     ".processed_log WHERE consumer = 'warehouse'")
              << "\n";
  };

  bool fail_next = false;  // makes the next delivery fail after its writes
  idem::HandlerOptions handler_options;
  handler_options.mode = idem::HandlerMode::transactional;
  auto handler = idem::make_idempotent_handler<std::string>(
      "warehouse", recorder,
      [&](const std::string& order_id, idem::BusProxy& bus, const idem::Event&) {
        // bus.transaction() is the open PostgresTransaction that also holds the marker.
        auto& tx = dynamic_cast<idem::postgres::PostgresTransaction&>(*bus.transaction());
        tx.exec("INSERT INTO " + schema + ".shipments (order_id, sku) VALUES ($1, $2)",
                {order_id, "kettle"});
        tx.exec("UPDATE " + schema + ".stock SET units = units - 1 WHERE sku = $1", {"kettle"});
        if (fail_next) {
          fail_next = false;
          throw std::runtime_error("label printer jammed");  // rolls back both writes
        }
      },
      handler_options);
  idem::CollectingBusProxy bus("warehouse");

  const idem::Event paid = idem::Event::make("order.paid", "order-1001");
  const idem::Event other = idem::Event::make("order.paid", "order-1002");

  int status = 0;
  try {
    std::cout << "schema: " << schema << " on " << recorder->pool()->target() << "\n";
    show();
    std::cout << "deliver order-1001:   " << idem::to_string((*handler)(paid, bus)) << "\n";
    show();
    std::cout << "redeliver order-1001: " << idem::to_string((*handler)(paid, bus)) << "\n";
    show();
    fail_next = true;
    try {
      (*handler)(other, bus);
    } catch (const std::exception& e) {
      std::cout << "deliver order-1002:   failed (" << e.what() << ")\n";
    }
    show();  // the failed delivery's shipment and stock change were rolled back
    std::cout << "redeliver order-1002: " << idem::to_string((*handler)(other, bus)) << "\n";
    show();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    status = 1;
  }
  handler.reset();
  recorder.reset();  // closes idem's connections before the schema goes
  sql("DROP SCHEMA " + schema + " CASCADE");
  return status;
}
