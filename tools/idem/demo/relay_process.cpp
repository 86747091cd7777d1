// The demo's relay process (`idem demo-relay`, hidden; started by `idem demo --hops 2`).
//
// An OutboxRelay on the recorder's outbox (IDEM_DEMO_STORE), 32 rows a pass, whose publisher
// appends each confirmed row to the second hop's queue file — after handing the rows to RabbitMQ
// when IDEM_DEMO_BROKER is set — and logs "D seq id" per row to relay.log. With --stall-at it
// stops after the pass that brought the published rows to that count, before the relay deletes
// that pass's rows: the parent kills it there, so the restarted relay sends the batch again with
// the same ids. It exits once the outbox is empty.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../demo.hpp"
#include "../outbox_commands.hpp"
#include "file_queue.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"
#include "idem/outbox.hpp"
#include "relay_process.hpp"

#ifdef IDEM_HAVE_RABBITMQ
#include "idem/rabbitmq/outbox_publisher.hpp"
#include "idem/rabbitmq/publisher.hpp"
#endif

namespace idem::cli {
namespace {

// The relay's publisher (see the top of this file). Used from the relay's one thread.
class DemoRelayPublisher final : public OutboxPublisher {
 public:
  DemoRelayPublisher(const demo::HopFiles& files, const demo::fs::path& log,
                     std::shared_ptr<OutboxPublisher> inner, std::int64_t stall_at, int notify_fd)
      : queue_(files.queue),
        log_(log),
        inner_(std::move(inner)),
        stall_at_(stall_at),
        notify_fd_(notify_fd),
        next_seq_(demo::read_queue(files.queue).size()) {}

  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override {
    std::vector<OutboxRow> copies(rows.begin(), rows.end());
    for (std::size_t i = 0; i < copies.size(); ++i)
      copies[i].event.headers["seq"] = std::to_string(next_seq_ + i);
    std::vector<PublishVerdict> verdicts =
        inner_ ? inner_->publish(copies) : std::vector<PublishVerdict>(copies.size(), {true, ""});
    for (std::size_t i = 0; i < copies.size() && i < verdicts.size(); ++i) {
      if (!verdicts[i].confirmed) continue;
      const Event& event = copies[i].event;
      const nlohmann::json line = {{"id", event.id},
                                   {"type", event.type},
                                   {"payload", event.payload},
                                   {"seq", next_seq_},
                                   {"source", copies[i].source_event_id}};
      queue_.line(line.dump());
      log_.line("D " + std::to_string(next_seq_) + " " + event.id);
      ++next_seq_;
      ++published_;
    }
    if (stall_at_ >= 0 && static_cast<std::int64_t>(published_) >= stall_at_) {
      stall_at_ = -1;
      demo::write_all(notify_fd_, std::to_string(published_) + "\n");  // "kill me now"
      for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return verdicts;
  }

 private:
  demo::AppendLog queue_;
  demo::AppendLog log_;
  std::shared_ptr<OutboxPublisher> inner_;
  std::int64_t stall_at_;
  int notify_fd_;
  std::uint64_t next_seq_;
  std::uint64_t published_ = 0;
};

}  // namespace

int run_demo_relay(const RelayProcessOptions& options) {
  const demo::fs::path dir = options.dir;
  const char* store = std::getenv(kDemoStoreVariable);
  const std::string url =
      store != nullptr ? store : "sqlite://" + demo::fs::absolute(dir / "idem.db").string();
  std::string absent;
  const std::shared_ptr<Outbox> outbox = outbox_of(url, /*look_only=*/false, &absent);
  if (!outbox) throw NotSupported("--hops 2: " + redact_url(url) + ": " + absent);
  std::shared_ptr<OutboxPublisher> inner;
  const char* broker = std::getenv(kDemoBrokerVariable);
  if (broker != nullptr && *broker != '\0') {
#ifdef IDEM_HAVE_RABBITMQ
    rabbitmq::PublisherOptions publisher_options;
    publisher_options.exchange = options.exchange;
    inner =
        std::make_shared<rabbitmq::RabbitMqOutboxPublisher>(std::make_shared<rabbitmq::Publisher>(
            rabbitmq::ConnectionOptions::from_url(broker), publisher_options));
#else
    throw NotSupported("--broker: this idem was built without RabbitMQ (IDEM_WITH_RABBITMQ)");
#endif
  }
  OutboxRelayOptions relay_options;
  relay_options.batch_size = demo::kRelayBatch;
  relay_options.poll_interval = std::chrono::milliseconds(100);
  OutboxRelay relay(
      outbox,
      std::make_shared<DemoRelayPublisher>(demo::hop_files(dir, 2), dir / "relay.log", inner,
                                           options.stall_at, options.notify_fd),
      relay_options);
  // A pass may find the rows still held by the killed relay's transaction (PostgreSQL notices
  // the closed connection a moment later): try again, for at most a minute.
  for (int attempt = 0; attempt < 600; ++attempt) {
    relay.drain();
    if (outbox->stats().depth == 0) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "idem demo-relay: the outbox still holds " << outbox->stats().depth
            << " rows after a minute\n";
  return 1;
}

}  // namespace idem::cli
