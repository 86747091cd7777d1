// Shared by the Redis TLS tests (redis_tls_test.cpp: the blocking face, redis_tls_async_test.cpp:
// the coroutine face): where scripts/servers.sh's TLS listeners and certificates are, options
// for the good chain (mutual TLS), and the refusal cases each face must classify the same way.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/recorder.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

namespace idem::test::tls {

// The names both faces' tests use: a test file says `using namespace idem::test::tls;`.
using namespace idem::test::redis_names;

inline std::string tls_file(const std::string& name) {
  return env("IDEM_TEST_TLS_DIR") + "/" + name;
}

inline int port_of(const char* variable) {
  return std::atoi(env(variable).c_str());
}

class RedisTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (port_of("IDEM_TEST_REDIS_TLS_PORT") == 0 || env("IDEM_TEST_TLS_DIR").empty())
      IDEM_SERVER_MISSING("no Redis TLS listener: IDEM_TEST_REDIS_TLS_PORT / IDEM_TEST_TLS_DIR");
  }

  // The TLS listener with the good chain and the client certificate (mutual TLS).
  RedisOptions tls_options() const {
    RedisOptions options = keys_.options();
    options.host = "localhost";  // the name the server's certificate carries
    options.port = port_of("IDEM_TEST_REDIS_TLS_PORT");
    options.connect_timeout = 2s;
    options.tls = idem::redis::RedisTlsOptions{};
    options.tls->ca_file = tls_file("ca.crt");
    options.tls->cert_file = tls_file("client.crt");
    options.tls->key_file = tls_file("client.key");
    return options;
  }

  std::string tls_url() const {
    return "rediss://localhost:" + env("IDEM_TEST_REDIS_TLS_PORT") +
           "/0?tls_ca_file=" + tls_file("ca.crt") + "&tls_cert_file=" + tls_file("client.crt") +
           "&tls_key_file=" + tls_file("client.key") + "&prefix=" + keys_.prefix();
  }

  idem::test::RedisTestPrefix keys_{"tls"};
};

struct Refusal {
  const char* name;
  std::function<void(RedisOptions&)> change;
  std::vector<std::string> cause;  // substrings of the message
};

inline std::vector<Refusal> refusals() {
  return {
      {"wrong CA",
       [](RedisOptions& o) { o.tls->ca_file = tls_file("other-ca.crt"); },
       {"TLS: certificate verify failed"}},
      {"expired server certificate",
       [](RedisOptions& o) {
         o.port = port_of("IDEM_TEST_REDIS_TLS_EXPIRED_PORT");
         o.tls->cert_file.clear();
         o.tls->key_file.clear();
       },
       {"TLS: certificate verify failed", "certificate has expired"}},
      {"host name mismatch",
       [](RedisOptions& o) { o.host = "127.0.0.1"; },
       {"TLS: certificate verify failed", "host name mismatch", "'127.0.0.1'"}},
      {"no client certificate",
       [](RedisOptions& o) {
         o.tls->cert_file.clear();
         o.tls->key_file.clear();
       },
       {"TLS: the server refused", "certificate required"}},
      {"client certificate of another CA",
       [](RedisOptions& o) {
         o.tls->cert_file = tls_file("rogue-client.crt");
         o.tls->key_file = tls_file("rogue-client.key");
       },
       {"TLS: the server refused", "alert"}},
      {"no client certificate, with AUTH",
       [](RedisOptions& o) {
         o.tls->cert_file.clear();
         o.tls->key_file.clear();
         o.password = "whatever";
       },
       {"TLS: the server refused", "certificate required"}},
      {"plaintext client to the TLS port",
       [](RedisOptions& o) { o.tls.reset(); },
       {"TLS: the server speaks TLS on this port", "rediss://"}},
      {"plaintext client with AUTH to the TLS port",
       [](RedisOptions& o) {
         o.tls.reset();
         o.password = "whatever";
       },
       {"TLS: the server speaks TLS on this port", "rediss://"}},
      {"TLS client to the plaintext port",
       [](RedisOptions& o) {
         o.port = port_of("IDEM_TEST_REDIS_PORT");
         // The handshake waits this long for an answer that never comes, then a plaintext PING
         // must be answered within the same bound (at most 1 s) to name the cause: 300 ms was
         // too short for that PING on a loaded machine under ASan.
         o.connect_timeout = 1s;
       },
       {"TLS: the server answered in plaintext", "redis://"}},
  };
}

inline void expect_tls_refusal(const std::function<void()>& call, const Refusal& refusal,
                               const char* face) {
  SCOPED_TRACE(std::string(face) + ": " + refusal.name);
  try {
    call();
    ADD_FAILURE() << "the connection was accepted";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::tls) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt()) << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << e.what();
    for (const std::string& part : refusal.cause)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("whatever"), std::string::npos) << e.what();
  }
}

// Every refusal of refusals(), applied to `good`, for a recorder and a store of one face:
// `use_recorder(options)` and `use_store(options)` each open one on the refused options and make
// a call.
inline void expect_every_refusal(const RedisOptions& good, const std::string& face,
                                 const std::function<void(const RedisOptions&)>& use_recorder,
                                 const std::function<void(const RedisOptions&)>& use_store) {
  for (const auto& refusal : refusals()) {
    RedisOptions options = good;
    refusal.change(options);
    expect_tls_refusal([&] { use_recorder(options); }, refusal, (face + " recorder").c_str());
    expect_tls_refusal([&] { use_store(options); }, refusal, (face + " store").c_str());
  }
}

}  // namespace idem::test::tls
