// The transactional inbox on SQLite: a handler whose own writes commit in the same transaction
// as idem's "processed" marker, so a crash or an exception leaves both or neither.
//
//   example_sqlite_transactional_inbox [path/to/file.db]     (default: a new temporary file)
//
// A warehouse consumer receives "order.paid" events at least once. For each, it books a
// shipment row and takes the item out of stock — in the database that also holds the markers.
#include <sqlite3.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/sql.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace {

// Plain SQLite, as any other program sharing the file would use it: the schema of the
// warehouse's own tables, and a look at them after each delivery.
void exec(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_busy_timeout(db, 5000);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  const std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  if (rc != SQLITE_OK) throw std::runtime_error(message);
}

long long scalar(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* stmt = nullptr;
  long long value = -1;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    value = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

void show(const std::string& path) {
  std::cout << "    kettles in stock: " << scalar(path, "SELECT units FROM stock")
            << ", shipments: " << scalar(path, "SELECT count(*) FROM shipments") << ", markers: "
            << scalar(path, "SELECT count(*) FROM processed_log WHERE consumer = 'warehouse'")
            << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1]
                                    : (std::filesystem::temp_directory_path() /
                                       ("idem-inbox-" + idem::new_event_id() + ".db"))
                                          .string();
  auto recorder = std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path);
  exec(path,
       "CREATE TABLE IF NOT EXISTS shipments(order_id TEXT PRIMARY KEY, sku TEXT);"
       "CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY, units INTEGER);"
       "INSERT OR IGNORE INTO stock VALUES ('kettle', 10);");

  bool fail_next = false;  // makes the next delivery fail after its writes
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::transactional;
  auto handler = idem::make_idempotent_handler<std::string>(
      "warehouse", recorder,
      [&](const std::string& order_id, idem::BusProxy& bus, const idem::Event&) {
        // bus.transaction() is the open transaction that also holds the marker: an
        // idem::SqlTransaction on every SQL backend (this handler would run on PostgreSQL too).
        auto& tx = dynamic_cast<idem::SqlTransaction&>(*bus.transaction());
        tx.exec("INSERT INTO shipments(order_id, sku) VALUES ($1, $2)", {order_id, "kettle"});
        tx.exec("UPDATE stock SET units = units - 1 WHERE sku = $1", {"kettle"});
        if (fail_next) {
          fail_next = false;
          throw std::runtime_error("label printer jammed");  // rolls back both writes
        }
      },
      options);
  idem::CollectingBusProxy bus("warehouse");

  const idem::Event paid = idem::Event::make("order.paid", "order-1001");
  const idem::Event other = idem::Event::make("order.paid", "order-1002");

  std::cout << "database: " << path << "\n";
  show(path);
  std::cout << "deliver order-1001:   " << idem::to_string((*handler)(paid, bus)) << "\n";
  show(path);
  std::cout << "redeliver order-1001: " << idem::to_string((*handler)(paid, bus)) << "\n";
  show(path);

  fail_next = true;
  try {
    (*handler)(other, bus);
  } catch (const std::exception& e) {
    std::cout << "deliver order-1002:   failed (" << e.what() << ")\n";
  }
  show(path);  // the failed delivery's shipment and stock change were rolled back
  std::cout << "redeliver order-1002: " << idem::to_string((*handler)(other, bus)) << "\n";
  show(path);

  if (argc <= 1) {
    handler.reset();  // closes the database (the handler shares the recorder)
    recorder.reset();
    std::filesystem::remove(path);
    std::filesystem::remove(path + "-wal");
    std::filesystem::remove(path + "-shm");
  }
  return 0;
}
