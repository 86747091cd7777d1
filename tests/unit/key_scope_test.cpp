// Idempotency keys are scoped per operation: two operations never replay each other's results
// unless they name one scope explicitly. The durable stores are covered by the store conformance
// suite (ScopedKeys* tests); this file covers the in-memory default store and the key format.

#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "idem/error.hpp"
#include "idem/memory_store.hpp"
#include "idem/operation.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;

TEST(ScopedKey, FormatIsLengthPrefixed) {
  EXPECT_EQ(idem::scoped_idempotency_key("create_payment", "request-123"),
            "14:create_payment:request-123");
  EXPECT_EQ(idem::scoped_idempotency_key("a:b", "c"), "3:a:b:c");
  EXPECT_EQ(idem::scoped_idempotency_key("a", "b:c"), "1:a:b:c");
  EXPECT_NE(idem::scoped_idempotency_key("a:b", "c"), idem::scoped_idempotency_key("a", "b:c"));
  EXPECT_EQ(idem::scoped_idempotency_key("", "plain"), "plain");
}

TEST(ScopedKey, SplitIsTheInverse) {
  for (const auto& [scope, key] :
       std::initializer_list<std::pair<std::string, std::string>>{{"create_payment", "request-123"},
                                                                  {"a", "b"},
                                                                  {"with:colons:", ":and:more"},
                                                                  {std::string(100, 's'), ""},
                                                                  {"s", std::string(200, 'k')}}) {
    const std::string stored = idem::scoped_idempotency_key(scope, key);
    const auto split = idem::split_scoped_idempotency_key(stored);
    ASSERT_TRUE(split.has_value()) << stored;
    EXPECT_EQ(split->scope, scope);
    EXPECT_EQ(split->key, key);
  }
  for (const std::string_view unscoped :
       {"request-123", "", "14", "14:", "0:x:y", "01:x:y", "2:x:y", "3:abc", "3:abcd", "1000:x:y",
        ":x:y", "a3:abc:d"}) {
    EXPECT_FALSE(idem::split_scoped_idempotency_key(unscoped).has_value()) << unscoped;
  }
}

TEST(KeyScope, TwoOperationsWithTheSameKeyTextNeverShareAResult) {
  auto a_calls = std::make_shared<std::atomic<int>>(0);
  auto b_calls = std::make_shared<std::atomic<int>>(0);
  auto a = idem::resilient(
      [a_calls](const std::string&) { return "a-" + std::to_string(++*a_calls); },
      {.name = "scope_test_a", .idempotency_key = [](const std::string&) { return "same-key"; }});
  auto b = idem::resilient(
      [b_calls](const std::string&) { return "b-" + std::to_string(++*b_calls); },
      {.name = "scope_test_b", .idempotency_key = [](const std::string&) { return "same-key"; }});
  EXPECT_EQ(a("x").value, "a-1");
  EXPECT_EQ(b("x").value, "b-1");
  const auto replay_a = a("x");
  const auto replay_b = b("x");
  EXPECT_EQ(replay_a.value, "a-1");
  EXPECT_EQ(replay_b.value, "b-1");
  EXPECT_EQ(replay_a.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(replay_b.report.metadata.at("idempotency_key"), "same-key");
  EXPECT_EQ(replay_b.report.metadata.at("idempotency_scope"), "scope_test_b");
  EXPECT_EQ(replay_b.report.metadata.at("idempotency_stored_key"), "12:scope_test_b:same-key");
  EXPECT_EQ(*a_calls, 1);
  EXPECT_EQ(*b_calls, 1);
}

TEST(KeyScope, UnnamedOperationsGetAScopeOfTheirOwnInMemory) {
  auto a = idem::resilient([](int) { return 1; },
                           {.idempotency_key = [](int) { return "unnamed-key"; }});
  auto b = idem::resilient([](int) { return 2; },
                           {.idempotency_key = [](int) { return "unnamed-key"; }});
  EXPECT_EQ(a(0).value, 1);
  EXPECT_EQ(b(0).value, 2);
  EXPECT_EQ(a(0).value, 1);
  EXPECT_EQ(b(0).value, 2);
  // A copy is the same operation and shares its scope.
  auto a_copy = a;
  const auto replay = a_copy(0);
  EXPECT_EQ(replay.value, 1);
  EXPECT_EQ(replay.report.metadata.at("idempotency_status"), "replayed");
}

TEST(KeyScope, AnExplicitSharedScopeIsTheOptIn) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto a = idem::resilient([](int) { return 1; }, {.name = "writer",
                                                   .idempotency_key = [](int) { return "shared"; },
                                                   .idempotency_scope = "payments",
                                                   .idempotency_store = store});
  auto b = idem::operation("reader", [](int) { return 2; })
               .with_idempotency(
                   {.key = [](int) { return "shared"; }, .scope = "payments", .store = store});
  EXPECT_EQ(a(0).value, 1);
  const auto shared = b.run(0);
  EXPECT_EQ(shared.value, 1);
  EXPECT_EQ(shared.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_TRUE(store->lookup("8:payments:shared").has_value());
}

TEST(KeyScope, AnEmptyScopeIsTheUnscopedKeySpace) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto a =
      idem::resilient([](int) { return 7; }, {.name = "legacy",
                                              .idempotency_key = [](int) { return "legacy-key"; },
                                              .idempotency_scope = "",
                                              .idempotency_store = store});
  EXPECT_EQ(a(0).value, 7);
  EXPECT_TRUE(store->lookup("legacy-key").has_value());
}

TEST(KeyScope, TheBuilderScopesByItsName) {
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto op = idem::operation("charge", [](int amount) {
              return amount;
            }).with_idempotency({.key = [](int) { return "k"; }, .store = store});
  EXPECT_EQ(op.run(5).value, 5);
  EXPECT_TRUE(store->lookup("6:charge:k").has_value());
  EXPECT_FALSE(store->lookup("k").has_value());
}

TEST(KeyScope, TheScopedKeyMustFitTheKeyLimit) {
  const std::string scope(40, 's');
  auto op = idem::resilient([](const std::string&) { return 1; },
                            {.name = "long_keys",
                             .idempotency_key = [](const std::string& k) { return k; },
                             .idempotency_scope = scope});
  // "40:" + scope + ":" is 44 bytes, leaving 211 for the key.
  EXPECT_EQ(op(std::string(211, 'k')).value, 1);
  try {
    op(std::string(212, 'k'));
    FAIL() << "expected InvalidKey";
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("long_keys"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("212 bytes of key + 44 bytes"), std::string::npos)
        << e.what();
  }
  // The caller's own key is still checked on its own.
  EXPECT_THROW(op(std::string("bad\nkey")), idem::InvalidKey);
}

TEST(KeyScope, KeyReuseNamesTheCallersKeyNotTheStoredOne) {
  auto op = idem::resilient([](const std::string&, int amount) { return amount; },
                            {.name = "reuse",
                             .idempotency_key = [](const std::string& id, int) { return id; },
                             .idempotency_fingerprint = true});
  EXPECT_EQ(op("r1", 1).value, 1);
  try {
    op("r1", 2);
    FAIL() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    EXPECT_EQ(e.key(), "r1");
    const std::string what = e.what();
    EXPECT_EQ(what.find("idem: key_reuse: idem:"), std::string::npos) << what;
    EXPECT_NE(what.find("operation 'reuse': idempotency key 'r1'"), std::string::npos) << what;
    EXPECT_EQ(what.find("5:reuse:r1"), std::string::npos) << "the stored key: " << what;
  }
}

TEST(KeyScope, ScopesThatCannotWorkAreConfigErrors) {
  const auto key = [](int) { return std::string("k"); };
  EXPECT_THROW(idem::resilient([](int) { return 1; }, {.name = "n",
                                                       .idempotency_key = key,
                                                       .idempotency_scope = std::string(252, 's')}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient([](int) { return 1; },
                               {.name = "n", .idempotency_key = key, .idempotency_scope = "a\tb"}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient([](int) { return 1; }, {.name = "n", .idempotency_scope = "x"}),
               idem::ConfigError);
}

}  // namespace
