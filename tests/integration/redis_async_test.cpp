// idem::redis_async against the test server: the async recorder and store (same keys and scripts
// as the blocking face, so the two interoperate on one key), 1000 concurrent coroutines pipelined
// over one connection, cancellation before and after a command is written, a connection the
// server kills, connect and AUTH/SELECT failures, and calls from several threads at once.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_error.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "../free_port.hpp"
#include "../thrown_by.hpp"
#include "idem/error.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_async_connection_cases.hpp"
#include "redis_async_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_async_names;
using namespace asio::experimental::awaitable_operators;

// A loopback listener that never accepts, its backlog filled: a connect to it hangs (the SYN is
// dropped) until the client gives up.
class StuckListener {
 public:
  StuckListener() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(listener_.port()));
    for (int i = 0; i < 4; ++i) {  // fill the accept queue (non-blocking: the later ones hang)
      const int filler = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      (void)::connect(filler, reinterpret_cast<sockaddr*>(&address), sizeof address);
      fillers_.push_back(filler);
    }
    std::this_thread::sleep_for(50ms);
  }
  ~StuckListener() {
    for (int filler : fillers_)
      ::close(filler);
  }
  StuckListener(const StuckListener&) = delete;
  StuckListener& operator=(const StuckListener&) = delete;
  int port() const { return listener_.port(); }

 private:
  idem::test::LoopbackListener listener_{0};  // backlog 0: the fillers take the whole queue
  std::vector<int> fillers_;
};

class RedisAsync : public ::testing::Test {
 protected:
  idem::redis::RedisOptions options() const { return keys_.options(); }
  // Options for `stuck`, where a connect hangs until `connect_timeout`.
  idem::redis::RedisOptions options_for(const StuckListener& stuck,
                                        std::chrono::milliseconds connect_timeout) const {
    auto opts = options();
    opts.host = "127.0.0.1";
    opts.port = stuck.port();
    opts.connect_timeout = connect_timeout;
    return opts;
  }

  asio::io_context io_;
  idem::test::RedisTestPrefix keys_{"async"};
};

TEST_F(RedisAsync, RecorderMarksAndClaims) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  EXPECT_TRUE(recorder.capabilities().claims);
  EXPECT_FALSE(recorder.capabilities().transactions);
  run(io_, recorder.ping());
  EXPECT_FALSE(run(io_, recorder.is_processed("c", "e1")));
  run(io_, recorder.mark_processed("c", "e1"));
  run(io_, recorder.mark_processed("c", "e1"));  // a repeat is harmless
  EXPECT_TRUE(run(io_, recorder.is_processed("c", "e1")));

  const std::vector<std::string> ids = {"e1", "e2", "e3"};
  EXPECT_EQ(run(io_, recorder.is_processed_many("c", ids)),
            (std::vector<bool>{true, false, false}));
  EXPECT_EQ(run(io_, recorder.mark_processed_batch("c", ids)), 2u);
  EXPECT_EQ(run(io_, recorder.is_processed_many("c", ids)), (std::vector<bool>{true, true, true}));

  const Claim first = run(io_, recorder.claim("c", "x", 10s));
  ASSERT_EQ(first.status, Claim::Status::acquired);
  EXPECT_FALSE(first.took_over);
  EXPECT_EQ(run(io_, recorder.claim("c", "x", 10s)).status, Claim::Status::in_progress);
  EXPECT_TRUE(run(io_, recorder.renew("c", "x", first.token, 20s)));
  EXPECT_FALSE(run(io_, recorder.complete("c", "x", first.token + 1))) << "fenced";
  EXPECT_TRUE(run(io_, recorder.complete("c", "x", first.token)));
  EXPECT_TRUE(run(io_, recorder.is_processed("c", "x")));
  EXPECT_EQ(run(io_, recorder.claim("c", "x", 10s)).status, Claim::Status::processed);

  const Claim second = run(io_, recorder.claim("c", "y", 10s));
  ASSERT_EQ(second.status, Claim::Status::acquired);
  EXPECT_GT(second.token, first.token);
  EXPECT_TRUE(run(io_, recorder.release("c", "y", second.token)));
  EXPECT_FALSE(run(io_, recorder.release("c", "y", second.token)));
  EXPECT_EQ(run(io_, recorder.claim("c", "y", 10s)).status, Claim::Status::acquired);
}

TEST_F(RedisAsync, ArgumentsAreCheckedBeforeTheServer) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  EXPECT_THROW(run(io_, recorder.is_processed("", "e")), idem::InvalidKey);
  EXPECT_THROW((void)run(io_, recorder.claim("c", "e", 0ms)), idem::InvalidArgument);
  AsyncRedisStore store(io_.get_executor(), options());
  EXPECT_THROW((void)run(io_, store.lookup("")), idem::InvalidKey);
  EXPECT_EQ(recorder.pool()->stats().commands, 0u);
  EXPECT_EQ(store.pool()->stats().commands, 0u);
}

TEST_F(RedisAsync, StoreClaimsCompletesAndReplays) {
  AsyncRedisStore store(io_.get_executor(), options());
  EXPECT_TRUE(store.needs_bytes());
  EXPECT_FALSE(run(io_, store.lookup("k")).has_value());
  const ClaimOutcome claimed = run(io_, store.claim("k", std::string_view("fp"), 10s));
  ASSERT_EQ(claimed.status, ClaimOutcome::Status::acquired);
  // After a new key the next claim starts with SET NX GET (which returns the record holding the
  // key and writes nothing); after a live record, with a GET. Same outcomes.
  const std::string claim_text = keys_.command({"GET", store.record_key("k")}).str;
  EXPECT_EQ(run(io_, store.claim("k", std::string_view("fp"), 10s)).status,
            ClaimOutcome::Status::in_progress);
  EXPECT_EQ(keys_.command({"GET", store.record_key("k")}).str, claim_text);
  EXPECT_EQ(run(io_, store.claim("k", std::string_view("other"), 10s)).status,
            ClaimOutcome::Status::mismatch);
  EXPECT_EQ(keys_.command({"EXISTS", keys_.prefix() + "tokens"}).integer, 0);
  EXPECT_TRUE(run(io_, store.renew("k", claimed.token, 10s)));
  StoredValue value;
  value.bytes = std::string("result\0bytes", 12);
  ExecutionReport report;
  EXPECT_FALSE(run(io_, store.complete("k", claimed.token + 1, value, report, 60s)));
  EXPECT_TRUE(run(io_, store.complete("k", claimed.token, value, report, 60s)));
  const ClaimOutcome replay = run(io_, store.claim("k", std::string_view("fp"), 10s));
  ASSERT_EQ(replay.status, ClaimOutcome::Status::completed);
  ASSERT_TRUE(replay.record.has_value());
  EXPECT_EQ(replay.record->value.bytes, value.bytes);
  const auto found = run(io_, store.lookup("k"));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->state, idem::IdempotencyRecord::State::completed);

  const ClaimOutcome other = run(io_, store.claim("k2", std::nullopt, 10s));
  ASSERT_EQ(other.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(run(io_, store.release("k2", other.token)));
  EXPECT_FALSE(run(io_, store.lookup("k2")).has_value());
}

TEST_F(RedisAsync, BlockingAndAsyncUsersOfOneKeyInteroperate) {
  idem::redis::RedisIdempotencyRecorder blocking_recorder(options());
  AsyncRedisRecorder async_recorder(io_.get_executor(), options());
  blocking_recorder.mark_processed("c", "from-blocking");
  EXPECT_TRUE(run(io_, async_recorder.is_processed("c", "from-blocking")));
  run(io_, async_recorder.mark_processed("c", "from-async"));
  EXPECT_TRUE(blocking_recorder.is_processed("c", "from-async"));

  // A claim taken by one face is held against the other, and fenced by its token.
  const Claim held = run(io_, async_recorder.claim("c", "shared", 10s));
  ASSERT_EQ(held.status, Claim::Status::acquired);
  EXPECT_EQ(blocking_recorder.claim("c", "shared", 10s).status, Claim::Status::in_progress);
  EXPECT_FALSE(blocking_recorder.complete("c", "shared", held.token + 1));
  EXPECT_TRUE(blocking_recorder.complete("c", "shared", held.token));
  EXPECT_EQ(run(io_, async_recorder.claim("c", "shared", 10s)).status, Claim::Status::processed);

  idem::redis::RedisIdempotencyStore blocking_store(options());
  AsyncRedisStore async_store(io_.get_executor(), options());
  const ClaimOutcome mine = blocking_store.claim("op", std::nullopt, 10s);
  ASSERT_EQ(mine.status, ClaimOutcome::Status::acquired);
  EXPECT_EQ(run(io_, async_store.claim("op", std::nullopt, 10s)).status,
            ClaimOutcome::Status::in_progress);
  StoredValue value;
  value.bytes = "42";
  EXPECT_TRUE(run(io_, async_store.complete("op", mine.token, value, ExecutionReport{}, 60s)));
  const auto replay = blocking_store.claim("op", std::nullopt, 10s);
  ASSERT_EQ(replay.status, ClaimOutcome::Status::completed);
  EXPECT_EQ(replay.record->value.bytes, std::optional<std::string>("42"));
  EXPECT_EQ(run(io_, async_store.lookup("op"))->value.bytes, std::optional<std::string>("42"));
}

TEST_F(RedisAsync, ThousandConcurrentCallsArePipelinedOnOneConnection) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  ASSERT_EQ(recorder.pool()->size(), 1u);
  constexpr int kCalls = 1000;
  std::atomic<int> done{0};
  std::atomic<int> acquired{0};
  std::vector<std::string> ids;
  for (int i = 0; i < kCalls; ++i)
    ids.push_back("e" + std::to_string(i % 500));  // every id claimed twice
  for (int i = 0; i < kCalls; ++i) {
    asio::co_spawn(
        io_,
        [&, i]() -> Task<void> {
          const Claim claim = co_await recorder.claim("c", ids[i], 30s);
          if (claim.status == Claim::Status::acquired) ++acquired;
          ++done;
        },
        asio::detached);
  }
  io_.run_for(30s);
  EXPECT_EQ(done.load(), kCalls);
  EXPECT_EQ(acquired.load(), 500) << "each id acquired exactly once";
  const auto stats = recorder.pool()->stats();
  EXPECT_EQ(stats.connects, 1u) << "one connection carried every call";
  EXPECT_GE(stats.commands, static_cast<std::uint64_t>(kCalls));
  EXPECT_LT(stats.writes, stats.commands / 10) << "commands were written in batches";
  // The server saw one client for them (plus the test's own helper connection).
  const RedisReply clients = keys_.command({"INFO", "clients"});
  EXPECT_NE(clients.str.find("connected_clients:"), std::string::npos);
}

// The command timeout stays armed from one call to the next while calls follow each other; once
// the connection is idle nothing of it is pending, so run() returns at once, not when the timer
// would have fired.
TEST_F(RedisAsync, BackToBackCallsLeaveNothingPendingOnceIdle) {
  idem::redis::RedisOptions slow = options();
  slow.command_timeout = 30s;
  AsyncConnection connection(io_.get_executor(), slow);
  int answered = 0;
  asio::co_spawn(
      io_,
      [&]() -> Task<void> {
        const std::array<std::string_view, 1> ping = {"PING"};
        for (int i = 0; i < 50; ++i) {
          const RedisReply reply = co_await connection.command(ping, CommandKind::read, "PING");
          if (!reply.is_error()) ++answered;
        }
      },
      asio::detached);
  const auto started = std::chrono::steady_clock::now();
  io_.run();
  EXPECT_EQ(answered, 50);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s)
      << "a timer kept the idle loop running";
}

TEST_F(RedisAsync, CallsFromSeveralThreadsResumeOnTheirOwnExecutor) {
  asio::io_context home;  // the connection's I/O runs here
  auto guard = asio::make_work_guard(home);
  std::thread io_thread([&] { home.run(); });
  AsyncRedisRecorder recorder(home.get_executor(), options());
  asio::thread_pool callers(4);
  std::atomic<int> ok{0}, wrong_thread{0};
  std::vector<std::future<void>> finished;
  for (int i = 0; i < 200; ++i) {
    finished.push_back(asio::co_spawn(
        callers,
        [&, i]() -> Task<void> {
          const auto id = std::this_thread::get_id();
          co_await recorder.mark_processed("t", "e" + std::to_string(i));
          if (std::this_thread::get_id() == io_thread.get_id()) ++wrong_thread;
          if (co_await recorder.is_processed("t", "e" + std::to_string(i))) ++ok;
          (void)id;
        },
        asio::use_future));
  }
  for (auto& f : finished)
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
  for (auto& f : finished)
    f.get();
  EXPECT_EQ(ok.load(), 200);
  EXPECT_EQ(wrong_thread.load(), 0) << "a caller resumed on the connection's thread";
  callers.join();
  guard.reset();
  home.stop();
  io_thread.join();
}

// ---- cancellation ---------------------------------------------------------------------------

TEST_F(RedisAsync, CancelledBeforeWrittenIsWithdrawn) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  asio::cancellation_signal signal;
  std::exception_ptr error;
  bool finished = false;
  asio::co_spawn(io_, recorder.mark_processed("c", "withdrawn"),
                 asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                   error = e;
                   finished = true;
                 }));
  // The call has posted its command to the connection's strand; cancel before that runs.
  io_.poll_one();
  signal.emit(asio::cancellation_type::terminal);
  io_.run_for(10s);
  ASSERT_TRUE(finished);
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const asio::system_error& e) {
    EXPECT_EQ(e.code(), asio::error::operation_aborted);
  }
  EXPECT_EQ(recorder.pool()->stats().commands, 0u) << "nothing was written";
  EXPECT_EQ(recorder.pool()->stats().cancelled, 1u);
  EXPECT_FALSE(run(io_, recorder.is_processed("c", "withdrawn")));
}

TEST_F(RedisAsync, CancelledAfterWrittenKeepsThePipelineInSync) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  run(io_, recorder.ping());  // connected
  // The server holds every client's commands for 700 ms: the next command is written and waits.
  keys_.command({"CLIENT", "PAUSE", "700"});
  const auto cancelled_call = [&]() -> Task<bool> {
    asio::steady_timer timer(io_, 100ms);
    auto result =
        co_await (recorder.claim("c", "in-doubt", 10s) || timer.async_wait(asio::use_awaitable));
    co_return result.index() == 0;
  };
  EXPECT_FALSE(run(io_, cancelled_call())) << "the timer won; the claim was cancelled";
  EXPECT_EQ(recorder.pool()->stats().cancelled, 1u);
  // The cancelled claim's reply is read and dropped: the next call gets its own reply.
  EXPECT_EQ(run(io_, recorder.claim("c", "after", 10s)).status, Claim::Status::acquired);
  EXPECT_FALSE(run(io_, recorder.is_processed("c", "after")));
  // The written claim ran (its outcome was in doubt for the caller): the key is held.
  EXPECT_EQ(run(io_, recorder.claim("c", "in-doubt", 10s)).status, Claim::Status::in_progress);
  EXPECT_EQ(recorder.pool()->stats().connects, 1u) << "no reconnect was needed";
}

TEST_F(RedisAsync, CancelledWhileConnectingIsWithdrawn) {
  StuckListener stuck;
  const auto opts = options_for(stuck, 3s);
  AsyncRedisRecorder recorder(io_.get_executor(), opts);
  std::chrono::steady_clock::duration waited{};
  const auto call = [&]() -> Task<bool> {
    const auto started = std::chrono::steady_clock::now();
    asio::steady_timer timer(io_, 100ms);
    auto result =
        co_await (recorder.is_processed("c", "e") || timer.async_wait(asio::use_awaitable));
    waited = std::chrono::steady_clock::now() - started;
    co_return result.index() == 0;
  };
  EXPECT_FALSE(run(io_, call()));
  EXPECT_LT(waited, 2s) << "the caller waited for the connect";
  EXPECT_EQ(recorder.pool()->stats().cancelled, 1u);
  EXPECT_EQ(recorder.pool()->stats().commands, 0u);
}

// ---- failures -------------------------------------------------------------------------------

TEST_F(RedisAsync, KilledConnectionFailsWrittenCallsAndReconnects) {
  AsyncConnection connection(io_.get_executor(), options());
  const RedisReply id = run(io_, connection.command({"CLIENT", "ID"}, CommandKind::read));
  ASSERT_EQ(id.type, RedisReply::Type::integer);
  keys_.command({"CLIENT", "PAUSE", "500"});
  // A write is in flight when the server kills the connection: in doubt, not retryable.
  const auto killed_write = [&]() -> Task<void> {
    const std::string key = keys_.prefix() + "x";
    const std::array<std::string_view, 3> args = {"SET", key, "1"};
    (void)co_await connection.command(args, CommandKind::write, "set");
  };
  std::thread killer([&] {
    std::this_thread::sleep_for(150ms);
    keys_.command({"CLIENT", "KILL", "ID", std::to_string(id.integer)});
  });
  try {
    run(io_, killed_write());
    ADD_FAILURE() << "the killed connection's write succeeded";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::io) << e.what();
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
  }
  killer.join();
  // The next call reconnects.
  const RedisReply pong = run(io_, connection.command({"PING"}, CommandKind::read));
  EXPECT_EQ(pong.str, "PONG");
  EXPECT_EQ(connection.stats().connects, 2u);
  EXPECT_GE(connection.stats().drops, 1u);
}

TEST_F(RedisAsync, IdleConnectionKilledIsReplacedWithoutAnError) {
  AsyncConnection connection(io_.get_executor(), options());
  const RedisReply id = run(io_, connection.command({"CLIENT", "ID"}, CommandKind::read));
  idem::test::expect_idle_kill_replaced(io_, connection, keys_, id.integer);
}

TEST_F(RedisAsync, ServerDownIsARetryableConnectError) {
  auto opts = options();
  opts.port = idem::test::unused_loopback_port();
  AsyncRedisRecorder recorder(io_.get_executor(), opts);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second waits for the backoff
    try {
      (void)run(io_, recorder.is_processed("c", "e"));
      ADD_FAILURE() << "a call to a closed port succeeded";
    } catch (const RedisError& e) {
      EXPECT_EQ(e.failure(), RedisFailure::connect) << e.what();
      EXPECT_EQ(e.code(), idem::ErrorCode::connection_refused) << e.what();
      EXPECT_TRUE(e.retryable());
      EXPECT_FALSE(e.in_doubt());
    }
  }
  EXPECT_EQ(recorder.pool()->stats().connect_failures, 2u);
}

// The coroutine face names a connect failure as the blocking face does: something else answering
// at the port is wrong_protocol (not retryable: it fails the same way every time), a host name
// that does not resolve host_not_found.
TEST_F(RedisAsync, AServerThatIsNotRedisIsWrongProtocol) {
  const idem::test::HttpListener web;
  auto opts = options();
  opts.port = web.port();
  AsyncRedisStore store(io_.get_executor(), opts);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      (void)run(io_, store.lookup("k"));
      ADD_FAILURE() << "a web server answered as Redis";
    } catch (const RedisError& e) {
      EXPECT_EQ(e.code(), idem::ErrorCode::wrong_protocol) << e.what();
      EXPECT_FALSE(e.retryable()) << e.what();
      EXPECT_FALSE(e.in_doubt()) << e.what();
      EXPECT_NE(std::string(e.what()).find("is this a Redis port?"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("HTTP/1.1"), std::string::npos) << e.what();
    }
  }
}

TEST_F(RedisAsync, AHostThatDoesNotResolveIsHostNotFound) {
  auto opts = options();
  opts.host = "nohost.invalid";  // RFC 2606: never resolves
  AsyncRedisRecorder recorder(io_.get_executor(), opts);
  const auto e =
      idem::test::thrown_by<RedisError>([&] { (void)run(io_, recorder.is_processed("c", "e")); });
  ASSERT_TRUE(e) << "nohost.invalid resolved";
  EXPECT_EQ(e->code(), idem::ErrorCode::host_not_found) << e->what();
  // A resolver that cannot be reached says "Temporary failure": retryable then, not otherwise.
  EXPECT_EQ(e->retryable(), std::string(e->what()).find("Temporary failure") != std::string::npos)
      << e->what();
  EXPECT_FALSE(e->in_doubt());
  EXPECT_NE(std::string(e->what()).find("nohost.invalid"), std::string::npos) << e->what();
}

TEST_F(RedisAsync, RefusedSelectIsAnAuthError) {
  auto opts = options();
  opts.db = 100000;  // beyond the server's databases
  AsyncRedisStore store(io_.get_executor(), opts);
  const auto e = idem::test::thrown_by<RedisError>([&] { (void)run(io_, store.lookup("k")); });
  ASSERT_TRUE(e) << "SELECT 100000 was accepted";
  EXPECT_EQ(e->failure(), RedisFailure::auth) << e->what();
  EXPECT_EQ(e->code(), idem::ErrorCode::store_open_failed);
  EXPECT_FALSE(e->retryable());
}

TEST_F(RedisAsync, ErrorRepliesAndNoscriptFallback) {
  AsyncRedisRecorder recorder(io_.get_executor(), options());
  const Claim claim = run(io_, recorder.claim("c", "s", 10s));
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  keys_.command({"SCRIPT", "FLUSH"});  // EVALSHA now answers NOSCRIPT: the source is sent
  EXPECT_TRUE(run(io_, recorder.complete("c", "s", claim.token)));
  // A foreign value under a marker key: WRONGTYPE is a corrupt record.
  keys_.command({"HSET", recorder.claim_key("c", "w"), "token", "notanumber"});
  const auto e = idem::test::thrown_by<idem::StoreError>(
      [&] { (void)run(io_, recorder.claim("c", "w", 10s)); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), idem::ErrorCode::store_corrupt_record) << e->what();
}

TEST_F(RedisAsync, DestroyedConnectionAbortsWaitingCalls) {
  StuckListener stuck;
  const auto opts = options_for(stuck, 5s);
  auto connection = std::make_unique<AsyncConnection>(io_.get_executor(), opts);
  std::exception_ptr error;
  bool finished = false;
  asio::co_spawn(io_, connection->command({"PING"}, CommandKind::read),
                 [&](std::exception_ptr e, RedisReply) {
                   error = e;
                   finished = true;
                 });
  io_.run_for(50ms);
  connection.reset();
  io_.restart();
  io_.run_for(10s);
  ASSERT_TRUE(finished);
  ASSERT_TRUE(error);
  EXPECT_THROW(std::rethrow_exception(error), asio::system_error);
}

TEST_F(RedisAsync, ConnectTimeoutIsARetryableTimedOutConnectError) {
  StuckListener stuck;
  const auto opts = options_for(stuck, 200ms);
  AsyncRedisStore store(io_.get_executor(), opts);
  const auto e = idem::test::thrown_by<RedisError>([&] { (void)run(io_, store.lookup("k")); });
  ASSERT_TRUE(e) << "a connect to a listener that never accepts succeeded";
  EXPECT_EQ(e->failure(), RedisFailure::connect) << e->what();
  EXPECT_TRUE(e->timed_out()) << e->what();
  EXPECT_TRUE(e->retryable());
}

}  // namespace
