// idem::async::detail::Pipeline, the engine under the Redis and PostgreSQL pipelined connections,
// driven by a line protocol over a real socket pair (the test plays the server): calls written in
// order and in one write per turn (a call to an idle connection at once; the calls of callers a
// reply resumed in writes of 16 as they are made, the rest after them), replies matched oldest
// first, cancellation by id (a queued call withdrawn whatever the type; a call in flight as its
// protocol judges the type, its reply read and dropped), failing every call when the connection
// drops, the owner's shut_down(), the end of the execution context (handlers destroyed, never
// called), and a socket its library closed unannounced (its number reused by another connection,
// whose waits must survive).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/system_error.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/async/detail/pipeline.hpp"

namespace {

using idem::async::detail::allows_side_effects;
using idem::async::detail::Pipeline;

struct LineCall {
  std::string line;
  bool writes = false;  // a call whose effect may happen on the server
};

// A call's outcome as the test sees it.
struct Outcome {
  bool done = false;
  std::string value;
  std::string error;  // "aborted", "in doubt", "lost", or the exception's text

  bool aborted() const { return done && error == "aborted"; }
};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const asio::system_error& e) {
    return e.code() == asio::error::operation_aborted ? "aborted" : e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
}

// "Connects" to one end of a socket pair once allowed, writes each call as a line, reads each
// reply as a line.
class LineProtocol : public Pipeline<LineProtocol, LineCall, std::string> {
 public:
  LineProtocol(asio::any_io_executor executor, int fd) : Pipeline(executor), fd_(fd) {}
  ~LineProtocol() {
    unwatch();
    if (fd_ >= 0) ::close(fd_);
  }

  // Any thread: let the connection come up (calls queue until then).
  void allow_connect() {
    asio::post(get_executor(), [self = shared_from_this()] {
      self->may_connect_ = true;
      self->schedule_pump();
    });
  }

  void pump() {
    if (!may_connect_ || fd_ < 0) return;
    if (!watching()) watch(fd_);
    std::string out;
    while (has_queued())
      out += send_next().call.line + "\n";
    if (!out.empty()) {
      ++writes;
      const ssize_t n = ::write(fd_, out.data(), out.size());
      if (n != static_cast<ssize_t>(out.size())) throw std::runtime_error("short write");
    }
    arm_read();
  }

  std::exception_ptr cancel_sent(const LineCall& call, asio::cancellation_type type) const {
    if (call.writes && !allows_side_effects(type)) return nullptr;
    return call.writes ? std::make_exception_ptr(std::runtime_error("in doubt"))
                       : idem::async::detail::operation_aborted();
  }

  void close_transport() noexcept {
    if (fd_ >= 0 && !library_closed_) ::close(fd_);
    fd_ = -1;
    transport_closed = true;
  }

  // The protocol's library closes its socket on its own, as libpq does on a read failure: the
  // engine is not told, and the number is free for the next socket anyone opens.
  int library_closes_socket() {
    ::close(fd_);
    library_closed_ = true;
    return fd_;
  }

  std::size_t writes = 0;
  bool transport_closed = false;

 private:
  void arm_read() {
    if (!has_in_flight()) return;
    when_readable([](LineProtocol& self, const asio::error_code& ec) {
      if (!ec) self.read();
    });
  }

  void read() {
    char buffer[4096];
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      // The server went away: the calls in flight are lost; those queued cannot be sent.
      end_transport();
      close_transport();
      fail_in_flight(
          [](const Pending&) { return std::make_exception_ptr(std::runtime_error("lost")); });
      fail_queued(
          [](const Pending&) { return std::make_exception_ptr(std::runtime_error("lost")); });
      return;
    }
    if (n > 0) input_.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t end; has_in_flight() && (end = input_.find('\n')) != std::string::npos;) {
      std::string reply = input_.substr(0, end);
      input_.erase(0, end + 1);
      Entry done = pop_oldest();
      complete(*done, nullptr, std::move(reply));
    }
    arm_read();
  }

  int fd_;
  bool library_closed_ = false;
  bool may_connect_ = false;
  std::string input_;
};

class AsyncPipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    server_ = fds[1];
    pipeline_ = std::make_shared<LineProtocol>(io_.get_executor(), fds[0]);
  }
  void TearDown() override {
    if (server_ >= 0) ::close(server_);
  }

  // Starts a call whose outcome lands in the returned slot; `signal` (if any) cancels it.
  std::shared_ptr<Outcome> call(std::string line, bool writes = false,
                                asio::cancellation_signal* signal = nullptr) {
    auto outcome = std::make_shared<Outcome>();
    auto handler = [outcome](std::exception_ptr error, std::string value) {
      outcome->done = true;
      outcome->value = std::move(value);
      if (error) outcome->error = describe(error);
    };
    LineCall c{std::move(line), writes};
    if (signal != nullptr) {
      pipeline_->start(asio::bind_cancellation_slot(signal->slot(),
                                                    asio::bind_executor(io_, std::move(handler))),
                       std::move(c));
    } else {
      pipeline_->start(asio::bind_executor(io_, std::move(handler)), std::move(c));
    }
    return outcome;
  }

  // Runs the io_context until `done` (bounded, so a failure cannot hang the suite).
  void run_until(const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < give_up) {
      io_.restart();
      io_.run_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(done());
  }
  void settle() {
    io_.restart();
    io_.poll();
  }

  // What the server received so far (the lines, in order).
  std::string received() {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(server_, buffer, sizeof buffer);
      if (n <= 0) break;
      received_.append(buffer, static_cast<std::size_t>(n));
      ++server_reads_;
    }
    return received_;
  }
  void reply(const std::string& lines) {
    ASSERT_EQ(::write(server_, lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  }

  asio::io_context io_;
  std::shared_ptr<LineProtocol> pipeline_;
  int server_ = -1;
  std::string received_;
  int server_reads_ = 0;
};

TEST_F(AsyncPipeline, CallsOfOneTurnGoOutInOneWriteAndRepliesMatchInOrder) {
  pipeline_->allow_connect();
  auto a = call("a");
  auto b = call("b");
  auto c = call("c");
  run_until([&] { return received() == "a\nb\nc\n"; });
  EXPECT_EQ(pipeline_->writes, 1u);
  EXPECT_EQ(pipeline_->load(), 3u);
  reply("A\nB\n");
  run_until([&] { return b->done; });
  EXPECT_FALSE(c->done);
  reply("C\n");
  run_until([&] { return c->done; });
  EXPECT_EQ(a->value, "A");
  EXPECT_EQ(b->value, "B");
  EXPECT_EQ(c->value, "C");
  EXPECT_TRUE(a->error.empty() && b->error.empty() && c->error.empty());
  EXPECT_EQ(pipeline_->load(), 0u);
}

TEST_F(AsyncPipeline, ACompletionRunsOnTheCallersExecutorNotTheConnections) {
  asio::io_context caller;
  bool done = false;
  pipeline_->allow_connect();
  pipeline_->start(
      asio::bind_executor(caller, [&](std::exception_ptr, std::string) { done = true; }),
      LineCall{"x"});
  run_until([&] { return received() == "x\n"; });
  reply("X\n");
  run_until([&] { return pipeline_->load() == 0; });  // completed: posted to `caller`
  EXPECT_FALSE(done);                                 // which has not run yet
  caller.run();
  EXPECT_TRUE(done);
}

TEST_F(AsyncPipeline, ACallToAnIdleConnectionIsWrittenBeforeStartReturnsOnItsThread) {
  pipeline_->allow_connect();
  auto first = call("first");
  run_until([&] { return received() == "first\n"; });
  reply("1\n");
  run_until([&] { return first->done; });
  // On a thread that runs the connection's context, with nothing queued or in flight: no turn of
  // the loop between the caller and the write.
  bool written = false;
  std::shared_ptr<Outcome> second;
  asio::post(io_, [&] {
    second = call("second");
    written = received() == "first\nsecond\n";
  });
  run_until([&] { return second != nullptr; });
  EXPECT_TRUE(written);
  reply("2\n");
  run_until([&] { return second->done; });
  EXPECT_EQ(second->value, "2");
}

TEST_F(AsyncPipeline, CallersResumedByAReplyRunAtOnceAndTheirCallsGoOutInOneWrite) {
  pipeline_->allow_connect();
  // Each caller, resumed by its reply, starts its next call from its completion; the last one
  // destroys its connection (its owner goes), which must find the engine between steps.
  std::vector<std::string> order;
  std::shared_ptr<Outcome> a2;
  std::shared_ptr<Outcome> b2;
  // Starts the call `line`; its completion records itself and starts the call `line`2 into `next`.
  auto start_then_call_again = [&](const std::string& line, std::shared_ptr<Outcome>& next) {
    auto outcome = std::make_shared<Outcome>();
    pipeline_->start(asio::bind_executor(io_,
                                         [&, outcome, line, into = &next](std::exception_ptr error,
                                                                          std::string value) {
                                           outcome->done = !error;
                                           outcome->value = value;
                                           order.push_back(line);
                                           *into = call(line + "2");
                                         }),
                     LineCall{line});
    return outcome;
  };
  auto a = start_then_call_again("a", a2);
  auto b = start_then_call_again("b", b2);
  run_until([&] { return received() == "a\nb\n"; });
  const std::size_t writes = pipeline_->writes;
  reply("A\nB\n");
  // One handler: the reply's readiness step, the two callers it resumed, and the write of the
  // calls they started, together.
  io_.restart();
  ASSERT_EQ(io_.run_one(), 1u);
  EXPECT_TRUE(a->done && b->done);
  EXPECT_EQ(a->value, "A");
  EXPECT_EQ(b->value, "B");
  EXPECT_EQ((std::vector<std::string>{"a", "b"}), order);
  EXPECT_EQ(received(), "a\nb\na2\nb2\n");
  EXPECT_EQ(pipeline_->writes, writes + 1);
  reply("A2\nB2\n");
  run_until([&] { return a2->done && b2->done; });
  EXPECT_EQ(a2->value, "A2");
  EXPECT_EQ(b2->value, "B2");
  EXPECT_EQ(pipeline_->load(), 0u);

  // A caller that shuts its connection down and lets it go from its completion.
  std::weak_ptr<LineProtocol> engine = pipeline_;
  bool closed_from_completion = false;
  pipeline_->start(asio::bind_executor(io_,
                                       [&](std::exception_ptr error, std::string) {
                                         closed_from_completion = !error;
                                         pipeline_->shut_down();
                                         pipeline_.reset();
                                       }),
                   LineCall{"last"});
  run_until([&] { return received() == "a\nb\na2\nb2\nlast\n"; });
  reply("L\n");
  run_until([&] { return closed_from_completion && engine.expired(); });
}

TEST_F(AsyncPipeline, ManyResumedCallersCallsGoOutInBatchesWhileTheOthersStillResume) {
  pipeline_->allow_connect();
  // 40 callers resumed by one read: their next calls go out 16 at a time as they are made (the
  // server can start on them while the others resume), the last 8 after them; in order.
  constexpr int kCallers = 40;
  std::vector<std::shared_ptr<Outcome>> next(kCallers);
  std::vector<std::string> seen_by;  // what the server had when callers 16 and 32 resumed
  std::string first_lines;
  std::string replies;
  for (int i = 0; i < kCallers; ++i) {
    const std::string name = "c" + std::to_string(i);
    first_lines += name + "\n";
    replies += "R" + std::to_string(i) + "\n";
    pipeline_->start(asio::bind_executor(io_,
                                         [&, i, name](std::exception_ptr error, std::string) {
                                           ASSERT_FALSE(error);
                                           if (i == 16 || i == 32) seen_by.push_back(received());
                                           next[static_cast<std::size_t>(i)] = call(name + "b");
                                         }),
                     LineCall{name});
  }
  run_until([&] { return received() == first_lines; });
  const std::size_t writes = pipeline_->writes;
  reply(replies);
  io_.restart();
  ASSERT_EQ(io_.run_one(), 1u);  // the read, the 40 callers and the writes of their calls
  std::string second_lines;
  for (int i = 0; i < kCallers; ++i)
    second_lines += "c" + std::to_string(i) + "b\n";
  EXPECT_EQ(received(), first_lines + second_lines);
  EXPECT_EQ(pipeline_->writes, writes + 3);
  ASSERT_EQ(seen_by.size(), 2u);
  EXPECT_EQ(seen_by[0], first_lines + second_lines.substr(0, second_lines.find("c16b")));
  EXPECT_EQ(seen_by[1], first_lines + second_lines.substr(0, second_lines.find("c32b")));
  std::string second_replies;
  for (int i = 0; i < kCallers; ++i)
    second_replies += "S" + std::to_string(i) + "\n";
  reply(second_replies);
  run_until([&] { return pipeline_->load() == 0; });
  for (int i = 0; i < kCallers; ++i)
    EXPECT_EQ(next[static_cast<std::size_t>(i)]->value, "S" + std::to_string(i));
}

TEST_F(AsyncPipeline, AQueuedCallIsWithdrawnByAnyCancellationTypeAndNeverSent) {
  asio::cancellation_signal total;
  asio::cancellation_signal terminal;
  auto first = call("first");
  auto withdrawn_total = call("withdrawn-total", /*writes=*/true, &total);
  auto withdrawn_terminal = call("withdrawn-terminal", /*writes=*/true, &terminal);
  auto last = call("last");
  settle();  // all four queued: the connection is not up yet
  total.emit(asio::cancellation_type::total);
  terminal.emit(asio::cancellation_type::terminal);
  run_until([&] { return withdrawn_total->done && withdrawn_terminal->done; });
  EXPECT_TRUE(withdrawn_total->aborted());
  EXPECT_TRUE(withdrawn_terminal->aborted());
  EXPECT_EQ(pipeline_->cancelled(), 2u);
  pipeline_->allow_connect();
  run_until([&] { return received() == "first\nlast\n"; });
  reply("1\n2\n");
  run_until([&] { return last->done; });
  EXPECT_EQ(first->value, "1");
  EXPECT_EQ(last->value, "2");
}

TEST_F(AsyncPipeline, AWriteInFlightEndsEarlyOnlyWhenItsTypeAcceptsSideEffects) {
  asio::cancellation_signal total;
  asio::cancellation_signal partial;
  asio::cancellation_signal read_total;
  pipeline_->allow_connect();
  auto kept = call("kept", /*writes=*/true, &total);
  auto doubted = call("doubted", /*writes=*/true, &partial);
  auto read = call("read", /*writes=*/false, &read_total);
  auto after = call("after");
  run_until([&] { return received() == "kept\ndoubted\nread\nafter\n"; });
  total.emit(asio::cancellation_type::total);  // a write sent: no effect-free way out
  partial.emit(asio::cancellation_type::partial);
  read_total.emit(asio::cancellation_type::total);  // a read has no effect: it ends
  run_until([&] { return doubted->done && read->done; });
  EXPECT_EQ(doubted->error, "in doubt");
  EXPECT_TRUE(read->aborted());
  EXPECT_FALSE(kept->done);
  // The replies of the cancelled calls are read and dropped: the pipeline stays in step.
  reply("K\nD\nR\nAFTER\n");
  run_until([&] { return kept->done && after->done; });
  EXPECT_EQ(kept->value, "K");
  EXPECT_TRUE(kept->error.empty());
  EXPECT_EQ(after->value, "AFTER");
  EXPECT_EQ(pipeline_->cancelled(), 2u);
  EXPECT_EQ(pipeline_->load(), 0u);
}

TEST_F(AsyncPipeline, ALostConnectionFailsEveryCallInFlight) {
  pipeline_->allow_connect();
  auto a = call("a", /*writes=*/true);
  auto b = call("b");
  run_until([&] { return received() == "a\nb\n"; });
  ::close(server_);
  server_ = -1;
  run_until([&] { return a->done && b->done; });
  EXPECT_EQ(a->error, "lost");
  EXPECT_EQ(b->error, "lost");
  EXPECT_TRUE(pipeline_->transport_closed);
  EXPECT_EQ(pipeline_->load(), 0u);
}

TEST_F(AsyncPipeline, ShutDownAbortsEveryCallAndEveryLaterOne) {
  pipeline_->allow_connect();
  auto sent = call("sent", /*writes=*/true);
  run_until([&] { return received() == "sent\n"; });
  pipeline_->shut_down();
  auto queued = call("queued");
  run_until([&] { return sent->done && queued->done; });
  EXPECT_TRUE(sent->aborted());
  EXPECT_TRUE(queued->aborted());
  EXPECT_TRUE(pipeline_->transport_closed);
  auto later = call("later");
  run_until([&] { return later->done; });
  EXPECT_TRUE(later->aborted());
  EXPECT_EQ(received(), "sent\n");  // nothing else reached the server
}

TEST_F(AsyncPipeline, EndingATransportWhoseSocketTheLibraryClosedLeavesItsNumbersNextOwnerAlone) {
  pipeline_->allow_connect();
  auto first = call("first");
  run_until([&] { return received() == "first\n"; });
  const int number = pipeline_->library_closes_socket();
  // The number goes to another connection's socket, on the same reactor.
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  if (fds[0] != number) {  // usually the lowest free number is it already
    ASSERT_EQ(::dup3(fds[0], number, O_CLOEXEC), number);
    ::close(fds[0]);
  }
  auto other = std::make_shared<LineProtocol>(io_.get_executor(), number);
  other->allow_connect();
  auto done = std::make_shared<Outcome>();
  other->start(asio::bind_executor(io_,
                                   [done](std::exception_ptr error, std::string value) {
                                     done->done = true;
                                     done->value = std::move(value);
                                     if (error) done->error = describe(error);
                                   }),
               LineCall{"second"});
  std::string at_other;
  run_until([&] {
    char buffer[64];
    const ssize_t n = ::read(fds[1], buffer, sizeof buffer);
    if (n > 0) at_other.append(buffer, static_cast<std::size_t>(n));
    return at_other == "second\n";
  });
  // The first connection ends; the other's wait for its reply must still be registered.
  pipeline_->shut_down();
  run_until([&] { return first->done; });
  ASSERT_EQ(::write(fds[1], "SECOND\n", 7), 7);
  run_until([&] { return done->done; });
  EXPECT_EQ(done->value, "SECOND");
  EXPECT_TRUE(done->error.empty());
  other->shut_down();
  run_until([&] { return other->transport_closed; });
  ::close(fds[1]);
}

TEST_F(AsyncPipeline, TheEndOfTheContextDestroysPendingCallsUncalled) {
  auto io = std::make_unique<asio::io_context>();
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto pipeline = std::make_shared<LineProtocol>(io->get_executor(), fds[0]);
  std::weak_ptr<LineProtocol> engine = pipeline;
  auto owned = std::make_shared<int>(0);
  std::weak_ptr<int> frame = owned;
  bool called = false;
  // The handler owns the connection, as a coroutine frame holding its recorder does: a cycle
  // only the context's end may cut.
  pipeline->start(asio::bind_executor(*io, [&called, owned = std::move(owned), pipeline](
                                               std::exception_ptr, std::string) { called = true; }),
                  LineCall{"never answered", true});
  pipeline->allow_connect();
  pipeline.reset();
  io->run_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(engine.expired());
  io.reset();  // its services shut down: the registry abandons the call
  EXPECT_FALSE(called);
  EXPECT_TRUE(frame.expired());
  EXPECT_TRUE(engine.expired());
  // The transport closed: after what was written, EOF at the server.
  char buffer[256];
  ssize_t n = 0;
  while ((n = ::read(fds[1], buffer, sizeof buffer)) > 0) {
  }
  EXPECT_EQ(n, 0);
  ::close(fds[1]);
}

}  // namespace
