// idem::redis_async when the io_context goes away with calls still waiting. Asio destroys the
// handlers pending on an execution context when the context is destroyed, without invoking
// them; a call waiting on an AsyncConnection is a coroutine frame that owns the connection's state
// (and, in an application, often the recorder or store itself), held in that connection's queue.
// Destroying the context must drop those calls too: the state, the pool and everything the
// frames own are freed (checked here through weak pointers, and by LeakSanitizer at exit under
// the asan preset) and the sockets are closed (the server no longer lists the clients).
//
// Commands are held in flight with CLIENT PAUSE WRITE (the server parks every write, reads still
// answer); TearDown unpauses, so a failing case fails instead of stalling the server.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "../eventually.hpp"
#include "../free_port.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "redis_async_names.hpp"
#include "redis_test_env.hpp"
#include "redis_tls_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_async_names;
using idem::test::eventually;

// A claim whose coroutine owns the recorder it waits on (a handler spawned with the recorder's
// shared_ptr): once the test lets go, only the connection's queue keeps the recorder alive.
Task<void> claim_owning(std::shared_ptr<AsyncRedisRecorder> recorder, std::string event) {
  (void)co_await recorder->claim("c", event, 10s);
}

// What the server says about its clients, and the pause that holds their writes.
class ServerView {
 public:
  explicit ServerView(const idem::test::RedisTestPrefix& keys) : keys_(keys) {}
  ServerView(const ServerView&) = delete;
  ServerView& operator=(const ServerView&) = delete;
  ~ServerView() {
    try {
      unpause();
    } catch (...) {
      // The server is gone; nothing is paused then.
    }
  }

  void pause_writes() {
    keys_.command({"CLIENT", "PAUSE", "30000", "WRITE"});
    paused_ = true;
  }
  void unpause() {
    if (paused_) keys_.command({"CLIENT", "UNPAUSE"});
    paused_ = false;
  }

  // The client's CLIENT LIST line ("" once it disconnected).
  std::string client(std::int64_t id) const {
    return keys_.command({"CLIENT", "LIST", "ID", std::to_string(id)}).str;
  }
  bool connected(std::int64_t id) const { return !client(id).empty(); }
  // The client waits on a command it sent, parked by the pause (a blocked client: flag b).
  bool parked(std::int64_t id) const {
    const std::string line = client(id);
    const auto at = line.find(" flags=");
    if (at == std::string::npos) return false;
    const auto flags = line.substr(at + 7, line.find(' ', at + 7) - (at + 7));
    return flags.find('b') != std::string::npos;
  }

 private:
  const idem::test::RedisTestPrefix& keys_;
  bool paused_ = false;
};

// The server-side id of every connection of `pool` (each opens for it).
std::vector<std::int64_t> client_ids(asio::io_context& io, AsyncConnectionPool& pool) {
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < pool.size(); ++i) {
    const auto reply = run(io, pool.at(i).command({"CLIENT", "ID"}, CommandKind::read));
    ids.push_back(reply.integer);
  }
  return ids;
}

class RedisAsyncShutdown : public ::testing::Test {
 protected:
  RedisOptions options() const {
    RedisOptions options = keys_.options();
    options.command_timeout = 60s;  // the pause, not a timeout, ends the calls
    return options;
  }

  idem::test::RedisTestPrefix keys_{"shutdown"};
  ServerView server_{keys_};
};

TEST_F(RedisAsyncShutdown, DestroyingTheContextFreesAPoolItsCallsOwnAndClosesItsConnections) {
  auto opts = options();
  opts.async_connections = 2;
  std::weak_ptr<AsyncRedisRecorder> recorder_alive;
  std::weak_ptr<AsyncConnectionPool> pool_alive;
  std::vector<std::int64_t> ids;
  {
    asio::io_context io;
    auto recorder = std::make_shared<AsyncRedisRecorder>(io.get_executor(), opts);
    recorder_alive = recorder;
    pool_alive = recorder->pool();
    ids = client_ids(io, *recorder->pool());
    server_.pause_writes();
    // One claim per connection (the pool takes them in turn), each coroutine owning the recorder.
    asio::co_spawn(io, claim_owning(recorder, "e0"), asio::detached);
    asio::co_spawn(io, claim_owning(recorder, "e1"), asio::detached);
    recorder.reset();
    io.restart();  // the calls above ran it out of work
    for (const std::int64_t id : ids) {
      ASSERT_TRUE(eventually([&] {
        io.poll();
        return server_.parked(id);
      })) << "client "
          << id << "'s claim never reached the server: " << server_.client(id);
    }
    io.stop();
  }  // the io_context goes with both claims waiting for their replies
  EXPECT_TRUE(recorder_alive.expired()) << "the recorder outlived its io_context";
  EXPECT_TRUE(pool_alive.expired()) << "the connection pool outlived its io_context";
  // Still paused: a client that disappears has closed its socket (it was not answered).
  for (const std::int64_t id : ids) {
    EXPECT_TRUE(eventually([&] { return !server_.connected(id); }))
        << "a connection of the destroyed context stayed open: " << server_.client(id);
  }
  server_.unpause();
  EXPECT_EQ(keys_.key_count(), 0u) << "a parked claim ran after all";
}

// The order the headers ask for (the store goes before its context), over TLS: the store's
// connection posts its own shut-down, which a stopped context never runs.
class RedisTlsAsyncShutdown : public idem::test::tls::RedisTls {
 protected:
  ServerView server_{keys_};
};

TEST_F(RedisTlsAsyncShutdown, DestroyingTheContextAfterTheStoreClosesTheTlsConnection) {
  auto opts = tls_options();
  opts.command_timeout = 60s;
  std::weak_ptr<AsyncConnectionPool> pool_alive;
  std::int64_t id = 0;
  {
    asio::io_context io;
    auto store = std::make_unique<AsyncRedisStore>(io.get_executor(), opts);
    pool_alive = store->pool();
    id = client_ids(io, *store->pool()).at(0);
    server_.pause_writes();
    asio::co_spawn(io, store->claim("k", std::nullopt, 10s), asio::detached);
    io.restart();
    ASSERT_TRUE(eventually([&] {
      io.poll();
      return server_.parked(id);
    })) << "the claim never reached the server: "
        << server_.client(id);
    io.stop();
    store.reset();
  }
  EXPECT_TRUE(pool_alive.expired()) << "the connection pool outlived its io_context";
  EXPECT_TRUE(eventually([&] { return !server_.connected(id); }))
      << "the TLS connection of the destroyed context stayed open: " << server_.client(id);
}

// A loopback listener that never accepts nor answers: a client's TCP connect succeeds (the
// kernel completes it) and its first command waits for a reply forever.
class SilentListener {
 public:
  int port() const { return listener_.port(); }
  // A connection waits to be accepted.
  bool pending() const {
    pollfd p{listener_.fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  // Accepts the pending connection and reads it to its end: true once the peer closed it.
  bool peer_closes() const {
    const int client = ::accept(listener_.fd(), nullptr, nullptr);
    if (client < 0) return false;
    bool closed = false;
    char buffer[256];
    for (int round = 0; round < 100 && !closed; ++round) {
      pollfd p{client, POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      const ssize_t n = ::read(client, buffer, sizeof buffer);
      closed = n <= 0;
    }
    ::close(client);
    return closed;
  }

 private:
  idem::test::LoopbackListener listener_{4};
};

// A call queued behind its connection's handshake (SELECT is written, never answered).
TEST(RedisAsyncShutdownQueued, DestroyingTheContextDropsACallWaitingForItsConnection) {
  SilentListener silent;
  auto opts = idem::test::redis_test_options("unused:");
  opts.host = "127.0.0.1";
  opts.port = silent.port();
  opts.db = 1;  // the handshake sends SELECT: the caller's command waits behind it
  opts.command_timeout = 60s;
  std::weak_ptr<AsyncRedisRecorder> recorder_alive;
  {
    asio::io_context io;
    auto recorder = std::make_shared<AsyncRedisRecorder>(io.get_executor(), opts);
    recorder_alive = recorder;
    asio::co_spawn(io, claim_owning(recorder, "e"), asio::detached);
    recorder.reset();
    ASSERT_TRUE(eventually([&] {
      io.poll();
      return silent.pending();
    })) << "the connection never reached the listener";
    io.run_for(20ms);
    io.stop();
  }
  EXPECT_TRUE(recorder_alive.expired()) << "the recorder outlived its io_context";
  EXPECT_TRUE(silent.peer_closes()) << "the connection of the destroyed context stayed open";
}

}  // namespace
