// The fork() case shared by the per-backend fork tests (fork_test.cpp for the in-memory
// recorder and store, sqlite_/redis_/postgres_/rabbitmq_fork_test.cpp for the others).
//
// use_idem() drives both faces on one backend the way an application does: a recorder (check,
// mark), an IdempotentHandler in exclusive mode called directly and through an idem::Bus (so
// claims, leases and the handler's lease renewal thread run, and the bus's worker threads), and a
// store behind a keyed resilient() call and a keyed operation() (so the process-wide
// coordinator registry and its lease renewal thread run); the calls execute, then replay.
//
// in_child() runs a function in a child made with fork() — no exec, which is the point: the child
// is a copy of a process that has used idem — and waits for it with a bound (a ForkedChild,
// worker/child_process.hpp: a hang fails the test instead of hanging it).
//
// alive_at_fork() keeps a recorder and a store alive across the fork and checks that the child
// is refused their use (ConfigError), not served through the parent's connections or threads.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "idem/bus.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/operation.hpp"
#include "idem/recorder.hpp"
#include "idem/resilient.hpp"
#include "worker/child_process.hpp"

namespace idem::test::fork {

// How the objects of one backend are made. Each call makes new objects.
struct Backend {
  std::function<std::shared_ptr<IdempotencyRecorder>()> recorder;
  std::function<std::shared_ptr<IdempotencyStore>()> store;
};

// What went wrong, one "; "-terminated clause per failed expectation ("" when all held).
class Findings {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) text_ += what + "; ";
  }
  void add(const std::string& what) { text_ += what + "; "; }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Uses a new recorder and a new store of `backend` under names that contain `tag` (so the
// parent's and the child's keys differ), and destroys them all before returning.
inline std::string use_idem(const Backend& backend, const std::string& tag) {
  Findings findings;
  try {
    const std::string consumer = "fork-" + tag;
    {
      auto recorder = backend.recorder();
      findings.expect(!recorder->is_processed(consumer, "marked"), "a new id was processed");
      recorder->mark_processed(consumer, "marked");
      findings.expect(recorder->is_processed(consumer, "marked"), "a marked id was not processed");

      std::atomic<int> runs{0};
      auto handler = make_idempotent_handler(
          consumer, recorder, [&runs](const std::string&) { ++runs; },
          HandlerOptions{.mode = HandlerMode::exclusive});
      CollectingBusProxy proxy(consumer);
      const Event event = Event::make("fork.test", "direct");
      findings.expect((*handler)(event, proxy) == HandleResult::processed,
                      "the handler's first call was not processed");
      findings.expect((*handler)(event, proxy) == HandleResult::duplicate,
                      "the handler's second call was not a duplicate");

      Bus bus(BusOptions{.worker_threads = 2});
      bus.subscribe("fork.test", handler);
      const Event through_bus = Event::make("fork.test", "bus");
      bus.publish(through_bus);
      bus.publish(through_bus);  // a redelivery
      bus.publish(Event::make("fork.test", "bus"));
      bus.wait_idle();
      findings.expect(runs.load() == 3, "the handler ran " + std::to_string(runs.load()) +
                                            " times for 3 distinct events");
    }
    {
      auto store = backend.store();
      std::atomic<int> executions{0};
      auto doubled = resilient(
          [&executions](int x) {
            ++executions;
            return 2 * x;
          },
          {.name = "fork_doubled",
           .idempotency_key = [tag](int x) { return "fork-" + tag + "-" + std::to_string(x); },
           .idempotency_store = store});
      const auto first = doubled(21);
      const auto again = doubled(21);
      findings.expect(first.value == 42 && again.value == 42, "resilient() returned a wrong value");
      findings.expect(
          first.report.metadata.at("idempotency_status") == "executed",
          "the first resilient() call was " + first.report.metadata.at("idempotency_status"));
      findings.expect(
          again.report.metadata.at("idempotency_status") == "replayed",
          "the second resilient() call was " + again.report.metadata.at("idempotency_status"));

      auto tripled =
          operation("fork_tripled",
                    [&executions](int x) {
                      ++executions;
                      return 3 * x;
                    })
              .with_idempotency(
                  {.key = [tag](int x) { return "fork-op-" + tag + "-" + std::to_string(x); },
                   .store = store});
      const auto op_first = tripled.run(5);
      const auto op_again = tripled.run(5);
      findings.expect(op_first.value == 15 && op_again.value == 15,
                      "operation() returned a wrong value");
      findings.expect(
          op_again.report.metadata.at("idempotency_status") == "replayed",
          "the second operation() call was " + op_again.report.metadata.at("idempotency_status"));
      findings.expect(
          executions.load() == 2,
          "the keyed calls executed " + std::to_string(executions.load()) + " times for 2 keys");
    }
  } catch (const std::exception& e) {
    findings.add(std::string("threw: ") + e.what());
  }
  return findings.text();
}

// How a child made by in_child() ended, in words ("" for exit status 0 with an empty report).
inline std::string in_child(const std::function<std::string()>& body,
                            std::chrono::seconds bound = std::chrono::seconds(60)) {
  ForkedChild child(body);
  return child.wait(bound).problem();
}

// Expects `call` to throw ConfigError saying that its object was made before fork().
template <class Call>
void expect_refused(Findings& findings, const std::string& what, Call&& call) {
  try {
    call();
    findings.add(what + " ran in the child");
  } catch (const ConfigError& e) {
    findings.expect(std::string(e.what()).find("before fork()") != std::string::npos,
                    what + ": the error does not say why: " + e.what());
  } catch (const std::exception& e) {
    findings.add(what + " threw something else than ConfigError: " + e.what());
  }
}

// Objects alive at fork belong to the parent: in the child the recorder's and the store's calls
// throw ConfigError (no connection, file or thread of the parent's is touched), new objects work
// beside them, and the parent's objects are leaked (the child ends with _exit). The parent goes
// on using its objects afterwards.
inline std::string alive_at_fork(const Backend& backend) {
  auto recorder = backend.recorder();
  auto store = backend.store();
  const std::string consumer = "fork-alive-" + std::to_string(::getpid());
  recorder->mark_processed(consumer, "before");
  if (store->claim(consumer, std::nullopt, std::chrono::seconds(30)).status !=
      ClaimOutcome::Status::acquired) {
    return "in the parent: the store's claim was not acquired";
  }
  const std::string child = in_child([&] {
    Findings findings;
    expect_refused(findings, "is_processed",
                   [&] { static_cast<void>(recorder->is_processed(consumer, "before")); });
    expect_refused(findings, "mark_processed", [&] { recorder->mark_processed(consumer, "x"); });
    expect_refused(findings, "claim", [&] {
      static_cast<void>(recorder->claim(consumer, "y", std::chrono::seconds(30)));
    });
    expect_refused(findings, "store lookup", [&] { static_cast<void>(store->lookup(consumer)); });
    expect_refused(findings, "store claim", [&] {
      static_cast<void>(store->claim(consumer + "-other", std::nullopt, std::chrono::seconds(30)));
    });
    const std::string fresh = use_idem(backend, "beside-" + std::to_string(::getpid()));
    if (!fresh.empty()) findings.add("new objects in the child: " + fresh);
    return findings.text();
  });
  if (!child.empty()) return child;
  Findings parent;
  parent.expect(recorder->is_processed(consumer, "before"),
                "the parent's marker is gone after the child");
  parent.expect(!recorder->is_processed(consumer, "x"), "the child's refused mark landed");
  const auto record = store->lookup(consumer);
  parent.expect(record && record->state == IdempotencyRecord::State::in_progress,
                "the parent's claim is gone after the child");
  return parent.text().empty() ? "" : "in the parent afterwards: " + parent.text();
}

// The case itself: use the backend in this process, destroy everything, fork, and use new
// objects of the same kind in the child.
inline std::string fork_after_use(const Backend& backend) {
  const std::string before = use_idem(backend, "parent-" + std::to_string(::getpid()));
  if (!before.empty()) return "in the parent: " + before;
  return in_child([&backend] { return use_idem(backend, "child-" + std::to_string(::getpid())); });
}

}  // namespace idem::test::fork
