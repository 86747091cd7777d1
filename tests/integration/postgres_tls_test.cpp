// PostgreSQL over TLS against the TLS-only server of scripts/servers.sh
// (IDEM_TEST_POSTGRES_TLS_URL, certificates in IDEM_TEST_TLS_DIR):
//   * sslmode=verify-full with sslrootcert and scram-sha-256 connects, from the URL (password
//     from password_file=) and from PostgresOptions (password_env), and the session is encrypted;
//   * mutual TLS (pg_hba clientcert=verify-full): the client certificate connects; none, or one
//     from another CA, is refused;
//   * a wrong CA, an expired server certificate and a host name mismatch are refused with a
//     non-retryable PostgresError (store_open_failed) whose message starts "TLS: " and names the
//     cause; plaintext to the TLS-only server fails at once, saying so;
//   * no password (from a file or the environment) appears in any message.
// Every case is skipped without the TLS server, or fails with IDEM_REQUIRE_SERVERS=1.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "../postgres_test_support.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "postgres_names.hpp"

namespace {

using namespace idem::test::postgres_names;
namespace fs = std::filesystem;

using idem::test::env;

class PostgresTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env("IDEM_TEST_POSTGRES_TLS_URL").empty() || env("IDEM_TEST_TLS_DIR").empty())
      IDEM_SERVER_MISSING("no TLS PostgreSQL server: IDEM_TEST_POSTGRES_TLS_URL is not set");
    tls_ = env("IDEM_TEST_TLS_DIR");
    port_ = env("IDEM_TEST_POSTGRES_TLS_PORT");
    password_ = env("IDEM_TEST_POSTGRES_TLS_PASSWORD");
    schema_ = "tls_" + std::to_string(::getpid()) + "_" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 100000);
  }

  // postgresql://USER@HOST:PORT/idem_test?QUERY
  std::string url(const std::string& user, const std::string& host,
                  const std::string& query) const {
    return "postgresql://" + user + "@" + host + ":" + port_ + "/idem_test?" + query;
  }
  std::string verify_full(const std::string& ca = "ca.crt") const {
    return "sslmode=verify-full&sslrootcert=" + tls_ + "/" + ca;
  }
  PostgresOptions options_for(const std::string& user, const std::string& host) const {
    PostgresOptions o;
    o.url = "postgresql://" + user + "@" + host + ":" + port_ + "/idem_test";
    o.schema = schema_;
    o.sslmode = "verify-full";
    o.sslrootcert = tls_ + "/ca.crt";
    o.password_file = tls_ + "/pg-password";
    o.pool_size = 2;
    o.connect_timeout = 20s;  // a refusal must come from TLS, long before this
    return o;
  }

  // The PostgresError a recorder's construction throws (its first connect).
  PostgresError refusal(const PostgresOptions& options) const {
    try {
      PostgresIdempotencyRecorder recorder(options);
    } catch (const PostgresError& e) {
      return e;
    }
    ADD_FAILURE() << "connected, but should have been refused";
    return PostgresError(idem::ErrorCode::store_error, "", "", true, false);
  }

  void expect_tls_refusal(const PostgresError& e, const std::string& cause) const {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << what;
    EXPECT_FALSE(e.retryable()) << what;
    EXPECT_FALSE(e.in_doubt()) << what;
    EXPECT_NE(what.find("TLS: "), std::string::npos) << what;
    EXPECT_NE(what.find(cause), std::string::npos) << what;
    EXPECT_EQ(what.find("within"), std::string::npos) << "hit connect_timeout: " << what;
    if (!password_.empty()) {
      EXPECT_EQ(what.find(password_), std::string::npos) << what;
    }
  }

  // Runs SQL as the superuser over the server's unix socket (set-up only).
  void admin(const std::string& sql) const {
    auto conn = idem::test::pg::connect(env("IDEM_TEST_POSTGRES_TLS_ADMIN_URL"));
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn.get(), sql.c_str()), &PQclear);
    ASSERT_TRUE(PQresultStatus(r.get()) == PGRES_TUPLES_OK ||
                PQresultStatus(r.get()) == PGRES_COMMAND_OK)
        << PQerrorMessage(conn.get());
  }

  void drop_schema() const { admin("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE"); }

  std::string tls_;
  std::string port_;
  std::string password_;
  std::string schema_;
};

TEST_F(PostgresTls, VerifyFullWithScramFromTheUrlWorks) {
  const std::string u =
      url("idem_tls", "localhost",
          verify_full() + "&password_file=" + tls_ + "/pg-password&schema=" + schema_);
  {
    auto recorder = idem::open_recorder(u);
    EXPECT_FALSE(recorder->is_processed("tls", "e1"));
    recorder->mark_processed("tls", "e1");
    EXPECT_TRUE(recorder->is_processed("tls", "e1"));
    auto store = idem::open_store(u);
    EXPECT_FALSE(store->lookup("tls-key").has_value());
  }
  // The server saw an encrypted session authenticated by SCRAM.
  auto conn =
      idem::test::pg::connect(u.substr(0, u.find("&password_file")) + "&password=" + password_);
  std::unique_ptr<PGresult, decltype(&PQclear)> r(
      PQexec(conn.get(), "SELECT ssl::text, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"),
      &PQclear);
  ASSERT_EQ(PQntuples(r.get()), 1) << PQerrorMessage(conn.get());
  EXPECT_STREQ(PQgetvalue(r.get(), 0, 0), "true");
  EXPECT_EQ(std::string(PQgetvalue(r.get(), 0, 1)).rfind("TLSv1.", 0), 0u);
  std::unique_ptr<PGresult, decltype(&PQclear)> scram(
      PQexec(conn.get(), "SELECT current_setting('password_encryption')"), &PQclear);
  EXPECT_STREQ(PQgetvalue(scram.get(), 0, 0), "scram-sha-256");
  drop_schema();
}

TEST_F(PostgresTls, OptionsStructWithPasswordFromTheEnvironmentWorks) {
  PostgresOptions o = options_for("idem_tls", "localhost");
  o.password_file.clear();
  ::setenv("IDEM_TLS_TEST_PG_PASSWORD", password_.c_str(), 1);
  o.password_env = "IDEM_TLS_TEST_PG_PASSWORD";
  {
    PostgresIdempotencyRecorder recorder(o);
    recorder.mark_processed("tls", "e2");
    EXPECT_TRUE(recorder.is_processed("tls", "e2"));
  }
  ::unsetenv("IDEM_TLS_TEST_PG_PASSWORD");
  drop_schema();
}

TEST_F(PostgresTls, SecretSourcesAreCheckedAtConstructionWithoutPrintingThem) {
  PostgresOptions o = options_for("idem_tls", "localhost");
  o.password = "inline-secret";  // and password_file: two sources
  try {
    PostgresIdempotencyRecorder recorder(o);
    FAIL() << "two password sources accepted";
  } catch (const idem::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("inline-secret"), std::string::npos) << e.what();
  }
  o.password.clear();
  o.password_file = tls_ + "/no-such-password-file";
  EXPECT_THROW(PostgresIdempotencyRecorder{o}, idem::ConfigError);
  o.password_file.clear();
  o.password_env = "IDEM_TLS_TEST_UNSET_VARIABLE";
  ::unsetenv("IDEM_TLS_TEST_UNSET_VARIABLE");
  EXPECT_THROW(PostgresIdempotencyRecorder{o}, idem::ConfigError);
  // A wrong password: refused (SQLSTATE 28P01), never retryable, and not shown.
  idem::test::TempDir dir;
  const std::string wrong = (dir.path() / "wrong").string();
  std::ofstream(wrong) << "wrong-password-value\n";
  o.password_env.clear();
  o.password_file = wrong;
  const PostgresError e = refusal(o);
  EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << e.what();
  EXPECT_EQ(e.sqlstate(), "28P01") << e.what();
  EXPECT_FALSE(e.retryable());
  EXPECT_EQ(std::string(e.what()).find("wrong-password-value"), std::string::npos) << e.what();
}

TEST_F(PostgresTls, WrongCaIsRefusedNamingTheCause) {
  PostgresOptions o = options_for("idem_tls", "localhost");
  o.sslrootcert = tls_ + "/other-ca.crt";
  const PostgresError e = refusal(o);
  expect_tls_refusal(e, "not trusted");
  // OpenSSL's own reason follows libpq's bare "certificate verify failed".
  EXPECT_NE(std::string(e.what()).find("not trusted (sslrootcert): "), std::string::npos)
      << e.what();
  // The same from a URL.
  try {
    (void)idem::open_recorder(url(
        "idem_tls", "localhost",
        verify_full("other-ca.crt") + "&password_file=" + tls_ + "/pg-password&schema=" + schema_));
    FAIL() << "connected with the wrong CA";
  } catch (const PostgresError& from_url) {
    expect_tls_refusal(from_url, "not trusted");
  }
}

TEST_F(PostgresTls, HostNameMismatchIsRefused) {
  // The certificate names DNS:localhost only.
  expect_tls_refusal(refusal(options_for("idem_tls", "127.0.0.1")), "host name mismatch");
}

TEST_F(PostgresTls, PlaintextToTheTlsOnlyServerFailsAtOnce) {
  PostgresOptions o = options_for("idem_tls", "localhost");
  o.sslmode = "disable";
  const PostgresError e = refusal(o);
  expect_tls_refusal(e, "only over TLS");
  EXPECT_EQ(e.sqlstate(), "28000");
}

TEST_F(PostgresTls, MutualTlsNeedsTheClientCertificate) {
  PostgresOptions o = options_for("idem_mtls", "localhost");
  expect_tls_refusal(refusal(o), "requires a client certificate");
  o.sslcert = tls_ + "/rogue-client.crt";  // signed by a CA the server does not trust
  o.sslkey = tls_ + "/rogue-client.key";
  expect_tls_refusal(refusal(o), "refused the TLS handshake");
  o.sslcert = tls_ + "/client.crt";
  o.sslkey = tls_ + "/client.key";
  {
    PostgresIdempotencyRecorder recorder(o);
    recorder.mark_processed("mtls", "e1");
    EXPECT_TRUE(recorder.is_processed("mtls", "e1"));
  }
  drop_schema();
  // Unreadable client files are a ConfigError at construction.
  o.sslkey = tls_ + "/no-such.key";
  EXPECT_THROW(PostgresIdempotencyRecorder{o}, idem::ConfigError);
}

TEST_F(PostgresTls, BadSslmodeIsAConfigError) {
  PostgresOptions o = options_for("idem_tls", "localhost");
  o.sslmode = "verify-everything";
  EXPECT_THROW(PostgresIdempotencyRecorder{o}, idem::ConfigError);
}

// Last: the server presents an expired certificate for a moment (its files are swapped and the
// configuration reloaded), then the good one again.
TEST_F(PostgresTls, ExpiredServerCertificateIsRefused) {
  const fs::path served = fs::path(env("IDEM_TEST_SERVERS_DIR")) / "pg-tls" / "server.crt";
  ASSERT_TRUE(fs::exists(served)) << served;
  const fs::path saved = served.string() + ".good";
  fs::copy_file(served, saved, fs::copy_options::overwrite_existing);
  const auto serve = [&](const fs::path& from) {
    {
      std::ifstream in(from, std::ios::binary);
      std::ofstream out(served, std::ios::binary | std::ios::trunc);  // keeps owner and mode
      out << in.rdbuf();
    }
    admin("SELECT pg_reload_conf()");
  };
  serve(fs::path(tls_) / "server-expired.crt");
  const PostgresOptions o = options_for("idem_tls", "localhost");
  std::string last;
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {  // the postmaster reloads asynchronously
    try {
      PostgresIdempotencyRecorder recorder(o);
    } catch (const PostgresError& e) {
      last = e.what();
      refused = last.find("expired") != std::string::npos;
      if (refused) expect_tls_refusal(e, "certificate has expired");
    }
    if (!refused) std::this_thread::sleep_for(50ms);
  }
  serve(saved);
  EXPECT_TRUE(refused) << "last: " << last;
  // The good certificate is back (bounded wait for the reload again).
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    try {
      PostgresIdempotencyRecorder recorder(o);
      back = true;
    } catch (const PostgresError&) {
      std::this_thread::sleep_for(50ms);
    }
  }
  EXPECT_TRUE(back);
  drop_schema();
}

}  // namespace
