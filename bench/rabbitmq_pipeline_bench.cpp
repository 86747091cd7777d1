// End-to-end events/s through RabbitMQ, with and without dedup.
//
//   bench_rabbitmq_pipeline AMQP_URL PIPELINE RECORDER_URL EVENTS
//                           [PREFETCH [OVERLAP [RTT_US [MODE]]]]
//
// PIPELINE is a label; RECORDER_URL "none" runs the plain pipeline (a handler that does the side
// effect, no recorder), anything else is opened with idem::open_recorder and wrapped in an
// IdempotentHandler (check_then_mark). Per run: a fresh exchange and queue, EVENTS events
// published with Publisher::publish_batch (batches of 500), then consumed by one Consumer
// (prefetch and batch_size PREFETCH, default 64; OVERLAP 1 (default) or 0 sets
// ConsumerOptions::pipeline: whether receiving overlaps the handler) until all are handled.
// RTT_US > 0 makes every recorder call wait that many microseconds first: a simulated
// round trip to a store on another machine (this machine runs broker, store and consumer on
// the same cores, where a round trip costs next to nothing). MODE "drain" (default) publishes
// everything first and times the consumer alone draining that backlog; "flow" runs the
// consumer while the events are published and times the whole stream, from the first publish
// to the last event handled (publish_eps is then the publisher's rate while both ran, and
// consume_eps the end-to-end rate). Prints one line:
//   pipeline=<label> events=N publish_eps=X consume_eps=Y mean_batch=B consumer_cores=C
//   machine_cores=M
//   [check_s=S mark_s=S] consume_s=S
// where C is the CPU this process used while consuming (in cores: CPU seconds per second), M
// what the whole machine used (broker and store included), and check_s / mark_s the wall time
// of the consume phase (consume_s) spent in is_processed_many / mark_processed_many (in flow
// mode all of these cover the whole stream).
// A plain program rather than Google Benchmark: each run needs its own broker topology, and
// bench/rabbitmq_dedup.sh alternates the pipelines across runs and takes the medians.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/recorder.hpp"

namespace {

// The side effect every pipeline performs: cheap, so the measured cost is the pipeline's.
std::atomic<std::uint64_t> g_effects{0};

class PlainHandler final : public idem::EventHandler {
 public:
  explicit PlainHandler(std::string consumer) : consumer_(std::move(consumer)) {}
  const std::string& consumer() const noexcept override { return consumer_; }
  idem::HandleResult operator()(const idem::Event&, idem::BusProxy&) override {
    g_effects.fetch_add(1, std::memory_order_relaxed);
    return idem::HandleResult::processed;
  }

 private:
  std::string consumer_;
};

// A recorder one simulated network round trip away: each call waits `rtt`, then forwards.
class DistantRecorder final : public idem::IdempotencyRecorder {
 public:
  DistantRecorder(std::shared_ptr<idem::IdempotencyRecorder> inner, std::chrono::microseconds rtt)
      : inner_(std::move(inner)), rtt_(rtt) {}
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    std::this_thread::sleep_for(rtt_);
    return inner_->is_processed(consumer, event_id);
  }
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    std::this_thread::sleep_for(rtt_);
    inner_->mark_processed(consumer, event_id);
  }
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override {
    std::this_thread::sleep_for(rtt_);
    return inner_->is_processed_many(consumer, event_ids);
  }
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override {
    std::this_thread::sleep_for(rtt_);
    inner_->mark_processed_many(consumer, event_ids);
  }
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    return inner_->purge(older_than, progress);
  }

 private:
  std::shared_ptr<idem::IdempotencyRecorder> inner_;
  std::chrono::microseconds rtt_;
};

// Forwards to the real recorder and adds up the wall time the batch calls take: where the
// handler thread waits (check_s, mark_s in the output line).
class TimedRecorder final : public idem::IdempotencyRecorder {
 public:
  explicit TimedRecorder(std::shared_ptr<idem::IdempotencyRecorder> inner)
      : inner_(std::move(inner)) {}
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    return inner_->is_processed(consumer, event_id);
  }
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    inner_->mark_processed(consumer, event_id);
  }
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override {
    const auto start = std::chrono::steady_clock::now();
    auto processed = inner_->is_processed_many(consumer, event_ids);
    check_ += std::chrono::steady_clock::now() - start;
    return processed;
  }
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override {
    const auto start = std::chrono::steady_clock::now();
    inner_->mark_processed_many(consumer, event_ids);
    mark_ += std::chrono::steady_clock::now() - start;
  }
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    return inner_->purge(older_than, progress);
  }
  // Read after the consumer has returned (the handler thread is done with this object).
  double check_seconds() const { return std::chrono::duration<double>(check_).count(); }
  double mark_seconds() const { return std::chrono::duration<double>(mark_).count(); }

 private:
  std::shared_ptr<idem::IdempotencyRecorder> inner_;
  std::chrono::steady_clock::duration check_{};
  std::chrono::steady_clock::duration mark_{};
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU seconds this process has used (all threads, user + system).
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// CPU seconds the whole machine has spent busy (every state of /proc/stat's "cpu" line but idle
// and iowait); 0 where /proc/stat cannot be read.
double machine_busy_seconds() {
  std::ifstream stat("/proc/stat");
  std::string label;
  stat >> label;
  if (label != "cpu") return 0;
  double busy = 0;
  for (int field = 0; field < 8; ++field) {  // user nice system idle iowait irq softirq steal
    double ticks = 0;
    if (!(stat >> ticks)) return 0;
    if (field != 3 && field != 4) busy += ticks;
  }
  return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int run(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: bench_rabbitmq_pipeline AMQP_URL PIPELINE RECORDER_URL|none EVENTS "
                 "[PREFETCH [OVERLAP [RTT_US [MODE]]]]\n";
    return 2;
  }
  const std::string amqp_url = argv[1];
  const std::string label = argv[2];
  const std::string recorder_url = argv[3];
  const std::size_t events = std::stoul(argv[4]);
  const int prefetch = argc > 5 ? std::stoi(argv[5]) : 64;
  const bool overlap = argc > 6 ? std::stoi(argv[6]) != 0 : true;
  const std::chrono::microseconds rtt(argc > 7 ? std::stol(argv[7]) : 0);
  const std::string mode = argc > 8 ? argv[8] : "drain";
  if (mode != "drain" && mode != "flow") {
    std::cerr << "MODE must be drain or flow, not " << mode << "\n";
    return 2;
  }
  const bool flow = mode == "flow";

  const auto connection = idem::rabbitmq::ConnectionOptions::from_url(amqp_url);
  const std::string id = idem::new_event_id().substr(0, 12);
  idem::rabbitmq::ConsumerOptions consumer_options;
  consumer_options.consumer_name = "bench-" + id + "-" + label;
  consumer_options.exchange = "idembench." + id;
  consumer_options.prefetch = prefetch;
  consumer_options.batch_size = prefetch;
  consumer_options.pipeline = overlap;
  idem::rabbitmq::PublisherOptions publisher_options;
  publisher_options.exchange = consumer_options.exchange;

  std::shared_ptr<idem::EventHandler> handler;
  std::shared_ptr<TimedRecorder> timed;  // null for the plain pipeline
  if (recorder_url == "none") {
    handler = std::make_shared<PlainHandler>(consumer_options.consumer_name);
  } else {
    std::shared_ptr<idem::IdempotencyRecorder> recorder = idem::open_recorder(recorder_url);
    if (rtt.count() > 0) recorder = std::make_shared<DistantRecorder>(std::move(recorder), rtt);
    timed = std::make_shared<TimedRecorder>(std::move(recorder));
    recorder = timed;
    handler = idem::make_idempotent_handler(
        consumer_options.consumer_name, std::move(recorder),
        [](const std::string&) { g_effects.fetch_add(1, std::memory_order_relaxed); },
        {idem::HandlerMode::check_then_mark});
  }

  idem::rabbitmq::Consumer consumer(connection, consumer_options);
  consumer.connect();  // declares the queue, so every event published below is kept
  const auto publish = [&] {
    idem::rabbitmq::Publisher publisher(connection, publisher_options);
    constexpr std::size_t kBatch = 500;
    std::vector<idem::Event> batch;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < events; ++i) {
      batch.push_back(idem::Event::make("order.paid", R"({"order":)" + std::to_string(i) + "}"));
      if (batch.size() == kBatch || i + 1 == events) {
        publisher.publish_batch(batch);
        batch.clear();
      }
    }
    return seconds_since(start);
  };

  const std::uint64_t before = g_effects.load();
  const auto all_handled = [&] { return g_effects.load() - before >= events; };
  double publish_s = 0;
  double cpu_before = 0;
  double busy_before = 0;
  std::chrono::steady_clock::time_point start;
  if (flow) {
    // Publisher and consumer at once: the clock runs from the first publish to the last event
    // handled.
    cpu_before = process_cpu_seconds();
    busy_before = machine_busy_seconds();
    start = std::chrono::steady_clock::now();
    std::thread consuming([&] { consumer.run_until(*handler, all_handled); });
    try {
      publish_s = publish();
    } catch (...) {
      consumer.stop();  // stop() may be called from any thread
      consuming.join();
      throw;
    }
    consuming.join();
  } else {
    publish_s = publish();
    cpu_before = process_cpu_seconds();
    busy_before = machine_busy_seconds();
    start = std::chrono::steady_clock::now();
    consumer.run_until(*handler, all_handled);
  }
  const double consume_s = seconds_since(start);
  std::cout << "pipeline=" << label << " events=" << events
            << " publish_eps=" << static_cast<double>(events) / publish_s;
  const double consumer_cores = (process_cpu_seconds() - cpu_before) / consume_s;
  const double machine_cores = (machine_busy_seconds() - busy_before) / consume_s;
  const auto stats = consumer.stats();
  std::cout << " consume_eps=" << static_cast<double>(events) / consume_s << " mean_batch="
            << static_cast<double>(stats.delivered) /
                   static_cast<double>(std::max<std::uint64_t>(stats.batches, 1))
            << " consumer_cores=" << consumer_cores << " machine_cores=" << machine_cores;
  if (timed) {
    std::cout << " check_s=" << timed->check_seconds() << " mark_s=" << timed->mark_seconds();
  }
  std::cout << " consume_s=" << consume_s << std::endl;

  idem::rabbitmq::delete_queue(connection, "idem." + consumer_options.consumer_name);
  idem::rabbitmq::delete_queue(connection, "idem." + consumer_options.consumer_name + ".dlq");
  idem::rabbitmq::delete_exchange(connection, consumer_options.exchange);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_rabbitmq_pipeline: " << e.what() << "\n";
    return 1;
  }
}
