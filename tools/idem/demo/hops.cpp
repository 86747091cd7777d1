// The demo's hops (hops.hpp).
#include "hops.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "broker.hpp"
#include "file_queue.hpp"
#include "idem/event.hpp"
#include "relay_process.hpp"

namespace idem::cli::demo {
namespace {

constexpr std::size_t kLabelWidth = 18;

// A pipe whose read end the demo keeps; the write end goes to one child.
struct NotifyPipe {
  Fd read_end;
  Fd write_end;
  NotifyPipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
    }
    read_end.fd = fds[0];
    write_end.fd = fds[1];
  }
};

std::vector<std::string> consumer_args(const HopContext& context, const ConsumerHop& hop,
                                       std::int64_t stall_at, int notify_fd) {
  const DemoOptions& options = context.options;
  std::vector<std::string> args = {"idem",         "demo-consumer",
                                   "--dir",        context.dir.string(),
                                   "--mode",       options.mode,
                                   "--consumer",   hop.consumer,
                                   "--ack-every",  std::to_string(options.ack_every),
                                   "--kill-point", kill_point_name(context.kill_point)};
  if (!context.ledger.empty()) args.insert(args.end(), {"--ledger", context.ledger});
  if (stall_at >= 0) {
    args.insert(args.end(),
                {"--stall-at", std::to_string(stall_at), "--notify-fd", std::to_string(notify_fd)});
  }
  if (options.hops == 2) args.insert(args.end(), {"--hop", std::to_string(hop.hop)});
  if (options.hops == 2 && hop.hop == 1) args.emplace_back("--outbox");
  return args;
}

std::vector<std::string> relay_args(const HopContext& context, const std::string& exchange,
                                    std::int64_t stall_at, int notify_fd) {
  std::vector<std::string> args = {"idem", "demo-relay", "--dir", context.dir.string()};
  if (!exchange.empty()) args.insert(args.end(), {"--exchange", exchange});
  if (stall_at >= 0) {
    args.insert(args.end(),
                {"--stall-at", std::to_string(stall_at), "--notify-fd", std::to_string(notify_fd)});
  }
  return args;
}

std::uint64_t furthest(const DeliveryStats& s) {
  return s.furthest;
}

std::uint64_t distinct_ids(const DeliveryStats& s) {
  return s.distinct_ids;
}

bool exited_ok(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

std::string bar_label(const std::string& name) {
  return "  " + name + std::string(kLabelWidth - std::min(kLabelWidth, name.size()), ' ');
}

std::optional<DeliveryStats> run_consumer_hop(const HopContext& context, const ConsumerHop& hop,
                                              std::uint64_t stream_size,
                                              std::int64_t latest_stall) {
  const HopFiles files = hop_files(context.dir, hop.hop);
  DeliveryLogReader log(files.deliveries);
  {
    ProgressBar bar(bar_label(hop.label), stream_size);
    NotifyPipe pipe;
    auto stall_at =
        static_cast<std::int64_t>(static_cast<double>(stream_size) * context.options.kill_at);
    if (latest_stall >= 0) stall_at = std::min(stall_at, latest_stall);
    DemoProcess first(consumer_args(context, hop, stall_at, pipe.write_end.fd), context.environment,
                      pipe.write_end.fd);
    ::close(pipe.write_end.fd);
    pipe.write_end.fd = -1;
    enter_phase(hop.phase);
    const WatchResult watched = watch(first, pipe.read_end.fd, log, bar, furthest, consumer_note);
    if (!watched.stalled) {
      bar.finish("exited");
      std::cerr << "idem demo: the first " << hop.who << " ended before it was killed ("
                << status_text(watched.status) << ")\n";
      return std::nullopt;
    }
    bar.finish("killed");
    std::cout << "  crash:     " << hop.who << " pid " << first.pid()
              << " SIGKILLed in the handler of delivery #" << watched.message << "\n"
              << "             ("
              << (context.options.broker.empty()
                      ? "last committed offset " + std::to_string(read_offset(files.offset)) +
                            ": the deliveries after it come again"
                      : std::string("its unacknowledged messages go back to the queue"))
              << ")" << std::endl;
  }
  ProgressBar bar(bar_label(hop.who + " restarted"), stream_size);
  DemoProcess second(consumer_args(context, hop, -1, -1), context.environment);
  enter_phase(hop.restarted_phase);
  const WatchResult watched = watch(second, -1, log, bar, furthest, consumer_note);
  bar.finish();
  if (!exited_ok(watched.status)) {
    std::cerr << "idem demo: the restarted " << hop.who << " failed ("
              << status_text(watched.status) << ")\n";
    return std::nullopt;
  }
  return log.poll();
}

std::optional<SecondHop> run_second_hop(const HopContext& context, IdempotencyRecorder& recorder,
                                        Outbox& outbox, const std::string& billing,
                                        const std::string& shipping,
                                        const std::set<std::string>& paid) {
  const DemoOptions& options = context.options;
  SecondHop result;
  result.follow_ups = outbox.stats().depth;
  const std::string exchange = options.broker.empty() ? std::string() : consumer_exchange(shipping);
  std::cout << "  outbox:    " << result.follow_ups
            << " order.charged follow-ups, committed with billing's markers\n";
  std::cout.flush();

  DeliveryLogReader relay_log(context.dir / "relay.log");
  {
    ProgressBar bar(bar_label("relaying"), result.follow_ups);
    NotifyPipe pipe;
    const auto stall_at = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(static_cast<double>(result.follow_ups) * options.kill_at));
    DemoProcess first(relay_args(context, exchange, stall_at, pipe.write_end.fd),
                      context.environment, pipe.write_end.fd);
    ::close(pipe.write_end.fd);
    pipe.write_end.fd = -1;
    enter_phase("relaying");
    const WatchResult watched =
        watch(first, pipe.read_end.fd, relay_log, bar, distinct_ids, relay_note);
    if (!watched.stalled) {
      bar.finish("exited");
      std::cerr << "idem demo: the first relay ended before it was killed ("
                << status_text(watched.status) << ")\n";
      return std::nullopt;
    }
    bar.finish("killed");
    std::cout << "  crash:     relay pid " << first.pid() << " SIGKILLed after publishing "
              << watched.message << " rows"
              << (options.broker.empty()
                      ? " to\n             " + hop_files(context.dir, 2).queue.filename().string()
                      : std::string(",\n             confirmed by the broker"))
              << ", before it deleted its last pass (" << kRelayBatch << " rows)" << std::endl;
  }
  {
    ProgressBar bar(bar_label("relay restarted"), result.follow_ups);
    DemoProcess second(relay_args(context, exchange, -1, -1), context.environment);
    enter_phase("relay-restarted");
    const WatchResult watched = watch(second, -1, relay_log, bar, distinct_ids, relay_note);
    bar.finish();
    if (!exited_ok(watched.status)) {
      std::cerr << "idem demo: the restarted relay failed (" << status_text(watched.status)
                << ")\n";
      return std::nullopt;
    }
  }
  const std::vector<Event> charged = read_queue(hop_files(context.dir, 2).queue);
  result.relayed = charged.size();
  std::set<std::string> ids;
  std::int64_t last_first_seen = 0;  // the last delivery that is an event's first
  for (const Event& event : charged) {
    if (ids.insert(event.id).second) last_first_seen = std::stoll(event.headers.at("seq"));
    const auto source = event.headers.find("source");
    if (source == event.headers.end() || paid.count(source->second) == 0 ||
        event.id != follow_up_id(billing, source->second, 0)) {
      result.ids_deterministic = false;
    }
  }
  result.distinct_relayed = ids.size();
  std::cout << "  relay:     " << result.relayed << " rows published (" << result.distinct_relayed
            << " distinct ids)\n";
  if (!exchange.empty()) {
    std::cout << "             to exchange " << exchange << "\n"
              << "             and queue idem." << shipping << "\n";
  }
  std::cout << "  consumer:  " << shipping << " (order.charged, its own markers and ledger)\n";
  std::cout.flush();

  const std::optional<DeliveryStats> shipped = run_consumer_hop(
      context, ConsumerHop{shipping, 2, "shipping", "shipping", "shipping", "shipping-restarted"},
      charged.size(),
      // The stream ends with the batch relayed again, all duplicates, which never reach the
      // handler: stall in a first delivery at the latest.
      last_first_seen);
  if (!shipped) return std::nullopt;
  result.stats = *shipped;
  result.ledger = count_ledger(recorder, context.ledger, shipping);
  for (const std::string& id : ids) {
    if (recorder.is_processed(shipping, id)) ++result.markers;
  }
  const OutboxStats left = outbox.stats();
  result.outbox_left = left.depth;
  result.outbox_parked = left.parked;
  return result;
}

}  // namespace idem::cli::demo
