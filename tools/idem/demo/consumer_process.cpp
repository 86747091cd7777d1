// The demo's consumer process (`idem demo-consumer`, hidden; started by `idem demo`).
//
// Consumes one hop's queue — the queue file from its committed offset, or with IDEM_DEMO_BROKER
// the run's RabbitMQ queue — through an IdempotentHandler on the recorder at IDEM_DEMO_STORE,
// logging every delivery (delivery_log.hpp). The business code records a payment: a ledger row
// written through the marker's transaction in transactional mode, else a line in the hop's
// side-effect log (an effect outside the recorder's database). With --stall-at it stops inside
// the handler of the first delivery at or after that position — before or after the side effect
// (--kill-point) — writes the position to --notify-fd and waits to be SIGKILLed.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../demo.hpp"
#include "../outbox_commands.hpp"
#include "broker.hpp"
#include "delivery_log.hpp"
#include "file_queue.hpp"
#include "idem/error.hpp"
#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/outbox.hpp"
#include "idem/sql.hpp"
#include "ledger.hpp"
#include "modes.hpp"

#ifdef IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#endif

namespace idem::cli {

int run_demo_consumer(const ConsumerOptions& options) {
  namespace demo = cli::demo;
  const demo::fs::path dir = options.dir;
  const HandlerMode mode = demo::parse_mode(options.mode);
  const char* store = std::getenv(kDemoStoreVariable);
  const std::string url =
      store != nullptr ? store : "sqlite://" + demo::fs::absolute(dir / "idem.db").string();
  std::shared_ptr<IdempotencyRecorder> recorder = open_recorder(url);
  const std::string consumer = options.consumer;
  const demo::HopFiles files = demo::hop_files(dir, options.hop);
  std::shared_ptr<Outbox> outbox;
  if (options.outbox) {
    std::string absent;
    outbox = outbox_of(url, /*look_only=*/false, &absent);
    if (!outbox) throw NotSupported("--hops 2: " + redact_url(url) + ": " + absent);
  }
  const std::string insert = demo::ledger_insert(options.ledger);
  const bool after_effect = options.kill_point != "before-effect";
  demo::AppendLog deliveries(files.deliveries);
  demo::AppendLog side_effects(files.side_effects);
  bool stalled = false;

  auto stall_here = [&](const Event& event) {
    if (stalled || options.stall_at < 0) return;
    // The first handler that runs at or after the chosen delivery: a duplicate dropped there
    // never reaches the handler, so "exactly at" could miss.
    const std::string& seq = event.headers.at("seq");
    if (std::stoll(seq) < options.stall_at) return;
    stalled = true;
    demo::write_all(options.notify_fd, seq + "\n");  // "kill me now": the parent sends SIGKILL
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  };

  // The business code: record a payment. In transactional mode the ledger row is written through
  // the marker's transaction; otherwise it is an external side effect (a line in a file).
  auto handler = make_idempotent_handler<nlohmann::json>(
      consumer, recorder,
      [&](const nlohmann::json& payload, BusProxy& bus, const Event& event) {
        if (!after_effect) stall_here(event);
        if (bus.transaction() == nullptr) {
          side_effects.line(event.id);
          // Killed here, the effect happened and its marker did not: check_then_mark runs it
          // again on redelivery, exclusive once the claim's lease has passed.
          stall_here(event);
          return;
        }
        auto* tx = dynamic_cast<SqlTransaction*>(bus.transaction());
        if (tx == nullptr)
          throw NotSupported("the demo has no ledger for this recorder's transactions");
        tx->exec(insert, {consumer, event.id, payload.at("order").get<std::int64_t>(),
                          payload.at("amount_cents").get<std::int64_t>()});
        if (outbox) {
          // A row of the outbox in this same transaction; its id is left empty, so it is
          // follow_up_id(consumer, event.id, 0) on every run of this handler.
          Event charged;
          charged.type = "order.charged";
          charged.payload = event.payload;
          bus.publish(std::move(charged));
        }
        // Killed here: the ledger row and the marker vanish together (the file's journal, or
        // the server, rolls both back).
        stall_here(event);
      },
      HandlerOptions{.mode = mode, .lease = demo::kLease, .outbox = outbox});

  const std::vector<Event> queue = demo::read_queue(files.queue);
  const char* broker = std::getenv(kDemoBrokerVariable);
  if (broker != nullptr && *broker != '\0') {
#ifdef IDEM_HAVE_RABBITMQ
    // RabbitMQ acknowledges each message after its handler returned; a killed consumer's
    // unacknowledged messages are delivered again. Done when every published message was
    // settled (by this process or the one before) and the queue holds nothing more.
    const auto connection = rabbitmq::ConnectionOptions::from_url(broker);
    rabbitmq::Consumer amqp(connection, demo::broker_consumer_options(consumer));
    std::set<std::uint64_t> settled = demo::settled_in_log(files.deliveries);
    demo::LoggedHandler logged(*handler, deliveries, settled);
    amqp.run_until(logged, [&] {
      return settled.size() >= queue.size() &&
             rabbitmq::queue_depth(connection, amqp.queue_name()) == 0;
    });
    return 0;
#else
    throw NotSupported("--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ)");
#endif
  }
  CollectingBusProxy bus(consumer);
  std::uint64_t offset = demo::read_offset(files.offset);
  while (offset < queue.size()) {
    const Event& event = queue[offset];
    const std::string seq = event.headers.at("seq");
    deliveries.line("D " + seq);
    try {
      const HandleResult result = (*handler)(event, bus);
      deliveries.line((result == HandleResult::processed ? "P " : "X ") + seq);
    } catch (const AlreadyInProgress&) {
      // A dead consumer's claim: not acknowledged; the broker redelivers it after a pause.
      deliveries.line("B " + seq);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    ++offset;
    if (offset % options.ack_every == 0) demo::commit_offset(files.offset, offset);
  }
  demo::commit_offset(files.offset, offset);
  return 0;
}

}  // namespace idem::cli
