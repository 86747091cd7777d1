// consumer_basics: side effects run once, however often an event is delivered.
//
// An in-process Bus delivers "order.created" events at least once to two consumers:
//   * billing  — an IdempotentHandler subclass with a typed JSON payload; the same event
//                delivered three times charges the card once;
//   * mailer   — a functional handler whose mail server fails twice; the bus redelivers it with
//                backoff and the mail goes out once.
// Both keep their own markers in one InMemoryIdempotencyRecorder (fanout).
//
// Run: ./example_consumer_basics
#include <atomic>
#include <iostream>
#include <stdexcept>
#include <string>

#include "idem/bus.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"

namespace shop {

struct Order {
  std::string id;
  int amount_cents = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Order, id, amount_cents)

// The subclass form: implement handle(); the base class decides whether it runs.
class ChargeCard : public idem::IdempotentHandler<Order> {
 public:
  using IdempotentHandler::IdempotentHandler;
  std::atomic<int> charges{0};

 protected:
  void handle(const Order& order, idem::BusProxy& bus, const idem::Event&) override {
    ++charges;
    std::cout << "  billing: charged " << order.amount_cents << " cents for " << order.id << "\n";
    // Follow-up events go through the proxy; the bus enqueues them.
    bus.publish(idem::Event::make("payment.captured", nlohmann::json(order).dump()));
  }
};

}  // namespace shop

int main() {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();

  idem::Bus bus({.max_attempts = 5,
                 .initial_backoff = std::chrono::milliseconds(5),
                 .on_dead_letter = [](const idem::DeadLetter& letter) {
                   std::cout << "  dead letter: " << letter.consumer << " gave up on "
                             << letter.event.id << ": " << letter.reason << "\n";
                 }});

  // Exclusive mode is chosen automatically: the in-memory recorder supports claims, so two
  // deliveries of one event never run handle() at the same time.
  auto billing = std::make_shared<shop::ChargeCard>("billing", recorder);
  bus.subscribe("order.created", billing);

  int mail_attempts = 0;
  int mails_sent = 0;
  bus.subscribe(
      "order.created",
      idem::make_idempotent_handler<shop::Order>("mailer", recorder, [&](const shop::Order& order) {
        if (++mail_attempts <= 2) {
          std::cout << "  mailer: mail server down (attempt " << mail_attempts
                    << "), will be redelivered\n";
          throw std::runtime_error("mail server unavailable");
        }
        ++mails_sent;
        std::cout << "  mailer: confirmation sent for " << order.id << "\n";
      }));

  bus.subscribe("payment.captured", "ledger", [](const idem::Event& event, idem::BusProxy&) {
    std::cout << "  ledger: recorded " << event.payload << "\n";
  });

  const idem::Event order =
      idem::Event::make("order.created", nlohmann::json(shop::Order{"order-1001", 2499}).dump());
  std::cout << "publishing " << order.id << " three times (a broker redelivering it)\n";
  for (int i = 0; i < 3; ++i)
    bus.publish(order);
  bus.wait_idle();

  const idem::BusStats stats = bus.stats();
  std::cout << "\ncard charges:  " << billing->charges.load()
            << " (billing mode: " << idem::to_string(billing->mode()) << ")\n"
            << "mails sent:    " << mails_sent << " after " << mail_attempts << " attempts\n"
            << "bus: published " << stats.published << ", delivered " << stats.delivered
            << ", duplicates dropped " << stats.duplicates << ", redeliveries "
            << stats.redeliveries << ", dead letters " << stats.dead_lettered << "\n";

  const bool ok = billing->charges == 1 && mails_sent == 1;
  std::cout << (ok ? "each side effect ran once\n" : "UNEXPECTED: a side effect repeated\n");
  return ok ? 0 : 1;
}
