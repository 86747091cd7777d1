// Follow-up events exactly once through the transactional outbox, on SQLite (docs/outbox.md).
//
//   example_sqlite_outbox [path/to/file.db]     (default: a new temporary file)
//
// Billing handles "order.created": it books a charge and publishes "order.charged" — both in
// the transaction that records the event as processed. An OutboxRelay hands committed follow-ups
// to an in-process Bus, where shipping handles them once. The demo delivers every order twice,
// lets billing fail once after publishing (rolled back: no charge, no follow-up) and loses the
// relay's first confirm (the rows are published again): shipping still ships each order once.
#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/bus.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/outbox.hpp"
#include "idem/sql.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace {

// A publisher that loses its first batch's confirms, as a relay killed after publishing would.
class ForgetfulPublisher final : public idem::OutboxPublisher {
 public:
  explicit ForgetfulPublisher(idem::Bus& bus) : inner_(bus) {}
  std::vector<idem::PublishVerdict> publish(std::span<const idem::OutboxRow> rows) override {
    auto verdicts = inner_.publish(rows);
    if (!forgot_) {
      forgot_ = true;
      throw std::runtime_error("confirms lost");
    }
    return verdicts;
  }

 private:
  idem::BusOutboxPublisher inner_;
  bool forgot_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  const bool temporary = argc < 2;
  const std::string path = temporary ? (std::filesystem::temp_directory_path() /
                                        ("idem-outbox-example-" + idem::new_event_id() + ".db"))
                                           .string()
                                     : argv[1];
  auto recorder = std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path);
  auto outbox = std::make_shared<idem::sqlite::SqliteOutbox>(path);  // the recorder's file
  // False on a later run: the setup marker says the table is there.
  static_cast<void>(recorder->run_transactional("setup", "schema", [](idem::Transaction& t) {
    dynamic_cast<idem::SqlTransaction&>(t).exec(
        "CREATE TABLE IF NOT EXISTS charges(order_no TEXT PRIMARY KEY)");
  }));

  // Downstream: shipping, an idempotent consumer of order.charged on the Bus.
  idem::Bus bus;
  std::atomic<int> shipped{0};
  bus.subscribe("order.charged",
                idem::make_idempotent_handler("shipping",
                                              std::make_shared<idem::InMemoryIdempotencyRecorder>(),
                                              [&](const std::string& order) {
                                                ++shipped;
                                                std::cout << "  shipping: ship " << order << "\n";
                                              }));

  // Upstream: billing, transactional, its follow-ups in the outbox.
  bool fail_once = true;
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::transactional;
  options.outbox = outbox;
  auto billing = idem::make_idempotent_handler(
      "billing", recorder,
      [&](const std::string& order, idem::BusProxy& proxy) {
        auto& tx = dynamic_cast<idem::SqlTransaction&>(*proxy.transaction());
        tx.exec("INSERT INTO charges(order_no) VALUES ($1)", {order});
        idem::Event charged;
        charged.type = "order.charged";  // no id: follow_up_id("billing", incoming id, 0)
        charged.payload = order;
        proxy.publish(std::move(charged));
        if (fail_once) {
          fail_once = false;
          throw std::runtime_error("billing failed after publishing");  // all rolled back
        }
      },
      options);

  idem::CollectingBusProxy upstream("billing");
  for (const char* order : {"A-1", "A-2", "A-3"}) {
    idem::Event created = idem::Event::make("order.created", order);
    created.id = std::string("created-") + order;
    for (int delivery = 0; delivery < 2; ++delivery) {  // at-least-once: every event twice
      std::string result;
      try {
        result = std::string(idem::to_string((*billing)(created, upstream)));
      } catch (const std::exception& e) {
        std::cout << "billing " << order << ": failed (" << e.what() << "), redelivered\n";
        result = std::string(idem::to_string((*billing)(created, upstream)));
      }
      std::cout << "billing " << order << ": " << result << "\n";
    }
  }
  std::cout << "outbox: " << outbox->stats().depth << " follow-ups waiting\n";

  idem::OutboxRelay relay(outbox, std::make_shared<ForgetfulPublisher>(bus));
  try {
    relay.run_once();
  } catch (const std::exception& e) {
    std::cout << "relay: " << e.what() << " (the rows stay and go out again)\n";
  }
  std::cout << "relay: published " << relay.drain() << "\n";
  bus.wait_idle();
  const auto stats = bus.stats();
  std::cout << "shipping: " << shipped.load() << " shipped, " << stats.duplicates
            << " duplicate follow-ups dropped\n";

  recorder.reset();
  outbox.reset();
  if (temporary) {
    for (const char* suffix : {"", "-wal", "-shm", "-outbox.lock"})
      std::filesystem::remove(path + suffix);
  }
  return shipped.load() == 3 ? 0 : 1;
}
