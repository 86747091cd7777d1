// fork() in a process that has used idem, with the in-memory recorder and store and with the
// process-wide default store (the other backends: sqlite_/redis_/postgres_fork_test.cpp).
//
//   * a process that used both faces and destroyed its objects forks; the child makes new
//     objects and uses them (check, mark, an exclusive handler directly and through a Bus, keyed
//     resilient() and operation() calls that execute and replay) and exits 0 within a bound;
//   * the child starts with a fresh default store: a key the parent executed there executes
//     once more in the child (the parent's in-memory results are not the child's), then replays;
//   * objects still alive at fork belong to the parent: in the child, a handler call, a keyed
//     call and a Bus publish on them throw ConfigError at once (no hang, no silent run without
//     lease renewals or workers), new objects work beside them, and these (a Bus, a handler, a
//     keyed callable, the in-memory recorder and store) may be destroyed in the child.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

#include "fork_case.hpp"
#include "idem/bus.hpp"
#include "idem/error.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"

namespace {

using ForkBackend = idem::test::fork::Backend;
using idem::test::fork::Findings;
using idem::test::fork::fork_after_use;
using idem::test::fork::in_child;
using idem::test::fork::use_idem;

ForkBackend memory_backend() {
  return ForkBackend{[] { return std::make_shared<idem::InMemoryIdempotencyRecorder>(); },
                     [] { return std::make_shared<idem::InMemoryIdempotencyStore>(); }};
}

TEST(ForkInMemory, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  EXPECT_EQ(fork_after_use(memory_backend()), "");
}

TEST(ForkInMemory, TwoGenerationsOfChildren) {
  // The child of a child: every fork starts over, however many came before.
  EXPECT_EQ(fork_after_use(memory_backend()), "");
  EXPECT_EQ(in_child([] { return fork_after_use(memory_backend()); }), "");
}

TEST(ForkInMemory, TheChildStartsWithAnEmptyDefaultStore) {
  int executions = 0;
  auto call = idem::resilient(
      [&executions](int x) {
        ++executions;
        return x + 1;
      },
      {.idempotency_key = [](int x) { return "fork-default-store-" + std::to_string(x); }});
  ASSERT_EQ(call(1).report.metadata.at("idempotency_status"), "executed");
  ASSERT_EQ(call(1).report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(
      in_child([] {
        Findings findings;
        int runs = 0;
        auto child_call = idem::resilient(
            [&runs](int x) {
              ++runs;
              return x + 1;
            },
            {.idempotency_key = [](int x) { return "fork-default-store-" + std::to_string(x); }});
        const auto first = child_call(1);
        const auto second = child_call(1);
        findings.expect(first.value == 2 && second.value == 2, "wrong values");
        findings.expect(first.report.metadata.at("idempotency_status") == "executed",
                        "the parent's key was " + first.report.metadata.at("idempotency_status") +
                            " in the child");
        findings.expect(
            second.report.metadata.at("idempotency_status") == "replayed",
            "the child's own result was " + second.report.metadata.at("idempotency_status"));
        findings.expect(runs == 1, "the child executed " + std::to_string(runs) + " times");
        return findings.text();
      }),
      "");
  EXPECT_EQ(executions, 1);
}

TEST(ForkInMemory, ObjectsAliveAtForkRefuseUseInTheChild) {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto store = std::make_shared<idem::InMemoryIdempotencyStore>();
  auto handler = idem::make_idempotent_handler(
      "fork-alive", recorder, [](const std::string&) {},
      idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
  const auto make_doubled = [&store] {
    return idem::resilient(
        [](int x) { return 2 * x; },
        {.idempotency_key = [](int x) { return "fork-alive-" + std::to_string(x); },
         .idempotency_store = store});
  };
  std::optional<decltype(make_doubled())> doubled(make_doubled());
  auto bus = std::make_unique<idem::Bus>();
  bus->subscribe("fork.test", handler);
  idem::CollectingBusProxy proxy("fork-alive");
  ASSERT_EQ((*handler)(idem::Event::make("fork.test", "parent"), proxy),
            idem::HandleResult::processed);
  ASSERT_EQ((*doubled)(1).value, 2);

  EXPECT_EQ(in_child([&] {
              Findings findings;
              try {
                (*handler)(idem::Event::make("fork.test", "child"), proxy);
                findings.add("the parent's handler ran in the child");
              } catch (const idem::ConfigError& e) {
                findings.expect(std::string(e.what()).find("fork") != std::string::npos,
                                std::string("the handler's error does not say why: ") + e.what());
              }
              try {
                (*doubled)(2);
                findings.add("the parent's keyed call ran in the child");
              } catch (const idem::ConfigError& e) {
                findings.expect(std::string(e.what()).find("fork") != std::string::npos,
                                std::string("the call's error does not say why: ") + e.what());
              }
              try {
                bus->publish(idem::Event::make("fork.test", "child"));
                findings.add("the parent's bus took an event in the child");
              } catch (const idem::ConfigError& e) {
                findings.expect(std::string(e.what()).find("fork") != std::string::npos,
                                std::string("the bus's error does not say why: ") + e.what());
              }
              // New objects work beside the parent's.
              const std::string fresh =
                  use_idem(memory_backend(), "beside-" + std::to_string(::getpid()));
              if (!fresh.empty()) findings.add("new objects in the child: " + fresh);
              // Memory-only objects of the parent may be destroyed in the child.
              bus.reset();  // its threads are the parent's: abandoned, not joined
              handler.reset();
              doubled.reset();
              recorder.reset();
              store.reset();
              return findings.text();
            }),
            "");
  // The parent's objects are untouched by all that.
  EXPECT_EQ((*handler)(idem::Event::make("fork.test", "parent-again"), proxy),
            idem::HandleResult::processed);
  EXPECT_EQ((*doubled)(3).value, 6);
  bus->publish(idem::Event::make("fork.test", "through-the-bus"));
  bus->wait_idle();
  EXPECT_EQ(bus->stats().delivered, 1u);
}

}  // namespace
