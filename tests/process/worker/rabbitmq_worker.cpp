// The consumer process of tests/process/rabbitmq_crash_test.cpp: consumes a RabbitMQ queue
// through idem::rabbitmq::Consumer with an idempotent handler, and can SIGKILL itself at one
// crash point while handling one chosen message — after the handler's side effect (before the
// marker), or after the handler returned (marker committed) but before the ack.
//
//   idem_test_rabbitmq_worker EXCHANGE CONSUMER RECORDER_URL MODE SIDE_EFFECTS_FILE EXPECTED
//                             [CRASH_POINT CRASH_AT_SEQ]
//
// The broker URL comes from IDEM_TEST_AMQP_URL. Side effect: a line "<event id>" appended to
// SIDE_EFFECTS_FILE (O_APPEND: on disk the moment write() returns) — or, in transactional mode,
// a row in the recorder database's ledger table written through the marker's transaction.
// Every published message carries a unique "seq" header (duplicates share the event id, not the
// seq). The worker exits 0 once EXPECTED distinct seqs have been settled by it or its killed
// predecessor (they share SEEN_FILE = SIDE_EFFECTS_FILE + ".settled") and the queue is empty, and
// prints its Consumer stats as one line of JSON.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/sqlite/sqlite_transaction.hpp"
#include "idem/testing/crash_points.hpp"

namespace {

using idem::testing::CrashPoint;

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const std::string text = line + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) throw std::runtime_error("write to " + path + " failed");
}

std::set<std::string> read_lines(const std::string& path) {
  std::set<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    lines.insert(line);
  return lines;
}

// Records each settled seq (for the stop condition) and fires the after-commit crash point.
class SettlingHandler final : public idem::EventHandler {
 public:
  SettlingHandler(idem::EventHandler& inner, std::string settled_file, std::set<std::string>& seen,
                  bool crash_before_ack, std::string crash_seq)
      : inner_(inner),
        settled_file_(std::move(settled_file)),
        seen_(seen),
        crash_before_ack_(crash_before_ack),
        crash_seq_(std::move(crash_seq)) {}
  const std::string& consumer() const noexcept override { return inner_.consumer(); }
  idem::HandleResult operator()(const idem::Event& event, idem::BusProxy& bus) override {
    const idem::HandleResult result = inner_(event, bus);
    settled(event);
    return result;
  }
  // The Consumer hands over batches: the inner handler's own batch path (one check and one mark
  // per batch in check_then_mark mode) is the one under test.
  std::vector<idem::HandleOutcome> handle_batch(std::span<const idem::Event> events,
                                                idem::BusProxy& bus) override {
    std::vector<idem::HandleOutcome> outcomes = inner_.handle_batch(events, bus);
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (outcomes[i].result) settled(events[i]);
    }
    return outcomes;
  }

 private:
  void settled(const idem::Event& event) {
    const std::string& seq = event.headers.at("seq");
    // The marker has committed; the Consumer acks when the batch returns. Dying here leaves a
    // processed but unacknowledged message, which the broker delivers again.
    if (crash_before_ack_ && seq == crash_seq_) ::raise(SIGKILL);
    append_line(settled_file_, seq);
    seen_.insert(seq);
  }

  idem::EventHandler& inner_;
  std::string settled_file_;
  std::set<std::string>& seen_;
  bool crash_before_ack_;
  std::string crash_seq_;
};

idem::HandlerMode parse_mode(const std::string& mode) {
  if (mode == "transactional") return idem::HandlerMode::transactional;
  if (mode == "exclusive") return idem::HandlerMode::exclusive;
  if (mode == "check_then_mark") return idem::HandlerMode::check_then_mark;
  throw std::invalid_argument("unknown mode " + mode);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && argc != 9) {
    std::cerr << "usage: idem_test_rabbitmq_worker EXCHANGE CONSUMER RECORDER_URL MODE "
                 "SIDE_EFFECTS_FILE EXPECTED [CRASH_POINT CRASH_AT_SEQ]\n";
    return 2;
  }
  try {
    const std::string exchange = argv[1];
    const std::string consumer = argv[2];
    const std::string recorder_url = argv[3];
    const idem::HandlerMode mode = parse_mode(argv[4]);
    const std::string side_effects = argv[5];
    const std::size_t expected = std::stoul(argv[6]);
    const CrashPoint point =
        argc == 9 ? idem::testing::parse_crash_point(argv[7]) : CrashPoint::none;
    const std::string crash_seq = argc == 9 ? argv[8] : "";
    const char* amqp = std::getenv("IDEM_TEST_AMQP_URL");
    if (amqp == nullptr) throw std::runtime_error("IDEM_TEST_AMQP_URL is not set");

    auto recorder = idem::open_recorder(recorder_url);
    auto handler = idem::make_idempotent_handler<std::string>(
        consumer, recorder,
        [&](const std::string&, idem::BusProxy& bus, const idem::Event& event) {
          if (auto* tx = dynamic_cast<idem::sqlite::SqliteTransaction*>(bus.transaction())) {
            sqlite3_stmt* insert = nullptr;
            sqlite3_prepare_v2(tx->db(), "INSERT INTO ledger(event_id) VALUES (?1)", -1, &insert,
                               nullptr);
            sqlite3_bind_text(insert, 1, event.id.c_str(), -1, SQLITE_TRANSIENT);
            const int rc = sqlite3_step(insert);
            sqlite3_finalize(insert);
            if (rc != SQLITE_DONE) throw std::runtime_error("ledger insert failed");
          } else {
            append_line(side_effects, event.id);
          }
          // After the side effect, before the marker: in transactional mode both are still
          // uncommitted and die together.
          if (point == CrashPoint::after_side_effect && event.headers.at("seq") == crash_seq) {
            ::raise(SIGKILL);
          }
        },
        idem::HandlerOptions{.mode = mode, .lease = std::chrono::milliseconds(1000)});

    std::set<std::string> seen = read_lines(side_effects + ".settled");
    SettlingHandler settling(*handler, side_effects + ".settled", seen,
                             point == CrashPoint::after_commit_before_ack, crash_seq);
    auto connection = idem::rabbitmq::ConnectionOptions::from_url(amqp);
    connection.initial_backoff = std::chrono::milliseconds(50);
    idem::rabbitmq::ConsumerOptions options;
    options.consumer_name = consumer;
    options.exchange = exchange;
    idem::rabbitmq::Consumer source(connection, options);
    source.run_until(settling, [&] {
      return seen.size() >= expected &&
             idem::rabbitmq::queue_depth(connection, source.queue_name()) == 0;
    });
    const auto stats = source.stats();
    std::cout << "{\"delivered\":" << stats.delivered << ",\"acked\":" << stats.acked
              << ",\"duplicates\":" << stats.duplicates << ",\"requeued\":" << stats.requeued
              << ",\"in_progress_requeued\":" << stats.in_progress_requeued
              << ",\"dead_lettered\":" << stats.dead_lettered << "}" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rabbitmq_worker: " << e.what() << "\n";
    return 1;
  }
}
