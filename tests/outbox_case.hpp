// The outbox's behaviour, the same on every SQL backend: a transactional handler's follow-ups
// commit (or roll back) with its marker, get deterministic ids, and are relayed with delete
// after confirm, parked after repeated refusals, never published by two relays at once.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/bus.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/outbox.hpp"
#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::test {

// Records every row it is given; confirms all, or refuses / fails as told.
class RecordingPublisher : public OutboxPublisher {
 public:
  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override {
    std::lock_guard lock(mutex);
    if (fail_next > 0) {
      --fail_next;
      for (const auto& row : rows)
        seen.push_back(row);  // "published", but the confirm is lost
      throw std::runtime_error("connection lost before the confirms");
    }
    std::vector<PublishVerdict> verdicts(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (refuse_type == rows[i].event.type) {
        verdicts[i].refusal = "refused: no route for " + rows[i].event.type;
      } else {
        verdicts[i].confirmed = true;
        seen.push_back(rows[i]);
      }
    }
    return verdicts;
  }
  std::vector<OutboxRow> rows() {
    std::lock_guard lock(mutex);
    return seen;
  }

  std::mutex mutex;
  std::vector<OutboxRow> seen;
  int fail_next = 0;
  std::string refuse_type;
};

struct OutboxFixture {
  std::shared_ptr<IdempotencyRecorder> recorder;
  std::shared_ptr<Outbox> outbox;
};

// A transactional handler of `consumer` that publishes `follow_ups` events of type
// "order.charged" (the first with an empty id, the rest with explicit ids "<event>-n"), and
// throws after publishing when `fail` says so.
inline std::shared_ptr<EventHandler> charging_handler(const OutboxFixture& f,
                                                      const std::string& consumer, int follow_ups,
                                                      std::function<bool()> fail = nullptr) {
  HandlerOptions options;
  options.mode = HandlerMode::transactional;
  options.outbox = f.outbox;
  return make_idempotent_handler(
      consumer, f.recorder,
      [follow_ups, fail](const std::string& payload, BusProxy& bus, const Event& event) {
        for (int i = 0; i < follow_ups; ++i) {
          Event out;
          out.type = "order.charged";
          out.payload = payload + "#" + std::to_string(i);
          out.headers["trace"] = "t-" + event.id;
          if (i > 0) out.id = event.id + "-" + std::to_string(i);
          bus.publish(std::move(out));
        }
        if (fail && fail()) throw std::runtime_error("handler failed after publishing");
      },
      options);
}

inline Event incoming(const std::string& id) {
  Event e = Event::make("order.created", "order-" + id);
  e.id = id;
  return e;
}

inline void outbox_commit_and_rollback_case(const OutboxFixture& f) {
  CollectingBusProxy proxy("billing");
  bool fail = true;
  auto handler = charging_handler(f, "billing", 2, [&] { return fail; });
  // Rollback: the handler published, then threw: neither marker nor follow-ups exist.
  EXPECT_THROW((*handler)(incoming("e1"), proxy), std::runtime_error);
  EXPECT_FALSE(f.recorder->is_processed("billing", "e1"));
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  // Commit: marker and both follow-ups together; nothing reaches the caller's proxy.
  fail = false;
  EXPECT_EQ((*handler)(incoming("e1"), proxy), HandleResult::processed);
  EXPECT_TRUE(f.recorder->is_processed("billing", "e1"));
  const OutboxStats stats = f.outbox->stats();
  EXPECT_EQ(stats.depth, 2u);
  EXPECT_EQ(stats.parked, 0u);
  ASSERT_TRUE(stats.oldest_age.has_value());
  EXPECT_TRUE(proxy.published().empty());
  // A redelivery is a duplicate and writes no row.
  EXPECT_EQ((*handler)(incoming("e1"), proxy), HandleResult::duplicate);
  EXPECT_EQ(f.outbox->stats().depth, 2u);

  // The rows, in order, with the deterministic id first and the explicit one kept.
  auto publisher = std::make_shared<RecordingPublisher>();
  OutboxRelay relay(f.outbox, publisher);
  EXPECT_EQ(relay.drain(), 2u);
  const auto rows = publisher->rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].event.id, follow_up_id("billing", "e1", 0));
  EXPECT_EQ(rows[1].event.id, "e1-1");
  EXPECT_LT(rows[0].seq, rows[1].seq);
  EXPECT_EQ(rows[0].consumer, "billing");
  EXPECT_EQ(rows[0].source_event_id, "e1");
  EXPECT_EQ(rows[0].event.type, "order.charged");
  EXPECT_EQ(rows[0].event.payload, "order-e1#0");
  EXPECT_EQ(rows[0].event.headers.at("trace"), "t-e1");
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  EXPECT_FALSE(f.outbox->stats().oldest_age.has_value());
}

inline void outbox_binary_payload_case(const OutboxFixture& f) {
  HandlerOptions options;
  options.mode = HandlerMode::transactional;
  options.outbox = f.outbox;
  const std::string bytes("a\0b\xff\x01", 5);
  auto handler = make_idempotent_handler(
      "bin", f.recorder,
      [&](const std::string&, BusProxy& bus) {
        Event out;
        out.type = "blob.sent";
        out.payload = bytes;
        bus.publish(out);
      },
      options);
  CollectingBusProxy proxy;
  ASSERT_EQ((*handler)(incoming("b1"), proxy), HandleResult::processed);
  auto publisher = std::make_shared<RecordingPublisher>();
  OutboxRelay relay(f.outbox, publisher);
  ASSERT_EQ(relay.drain(), 1u);
  EXPECT_EQ(publisher->rows().at(0).event.payload, bytes);
}

inline void outbox_bad_follow_up_case(const OutboxFixture& f) {
  HandlerOptions options;
  options.mode = HandlerMode::transactional;
  options.outbox = f.outbox;
  auto no_type = make_idempotent_handler(
      "bad", f.recorder, [](const std::string&, BusProxy& bus) { bus.publish(Event{}); }, options);
  CollectingBusProxy proxy;
  EXPECT_THROW((*no_type)(incoming("x1"), proxy), InvalidArgument);
  EXPECT_FALSE(f.recorder->is_processed("bad", "x1"));
  EXPECT_EQ(f.outbox->stats().depth, 0u);
  auto bad_id = make_idempotent_handler(
      "bad", f.recorder,
      [](const std::string&, BusProxy& bus) {
        Event e;
        e.id = std::string("a\0b", 3);
        e.type = "t";
        bus.publish(e);
      },
      options);
  EXPECT_THROW((*bad_id)(incoming("x2"), proxy), InvalidKey);
  EXPECT_EQ(f.outbox->stats().depth, 0u);
}

// Crash between the confirm and the delete (the publisher's confirms are lost): the rows stay,
// are published again with the same ids, and the downstream consumer drops the repeats.
inline void outbox_relay_through_bus_case(const OutboxFixture& f) {
  auto downstream_recorder = std::make_shared<InMemoryIdempotencyRecorder>();
  std::atomic<int> effects{0};
  Bus bus;
  bus.subscribe("order.charged",
                make_idempotent_handler("shipping", downstream_recorder,
                                        [&](const std::string&) { effects.fetch_add(1); }));
  CollectingBusProxy proxy("billing");
  auto handler = charging_handler(f, "billing", 1);
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ((*handler)(incoming("o" + std::to_string(i)), proxy), HandleResult::processed);

  // First: publish to the bus, then "lose the confirms" (a crash before the delete).
  class LosingPublisher : public OutboxPublisher {
   public:
    explicit LosingPublisher(Bus& bus) : inner_(bus) {}
    std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override {
      inner_.publish(rows);
      throw std::runtime_error("relay died after publishing, before deleting");
    }

   private:
    BusOutboxPublisher inner_;
  };
  {
    OutboxRelay losing(f.outbox, std::make_shared<LosingPublisher>(bus));
    EXPECT_THROW(losing.run_once(), std::runtime_error);
    EXPECT_EQ(losing.stats().failures, 1u);
  }
  EXPECT_EQ(f.outbox->stats().depth, 5u);
  OutboxRelay relay(f.outbox, std::make_shared<BusOutboxPublisher>(bus));
  EXPECT_EQ(relay.drain(), 5u);
  bus.wait_idle();
  EXPECT_EQ(effects.load(), 5);  // once each
  EXPECT_EQ(bus.stats().duplicates, 5u);
  EXPECT_EQ(f.outbox->stats().depth, 0u);
}

inline void outbox_parking_case(const OutboxFixture& f) {
  CollectingBusProxy proxy("billing");
  auto handler = charging_handler(f, "billing", 1);
  ASSERT_EQ((*handler)(incoming("p1"), proxy), HandleResult::processed);
  auto publisher = std::make_shared<RecordingPublisher>();
  publisher->refuse_type = "order.charged";
  OutboxRelayOptions options;
  options.max_attempts = 3;
  OutboxRelay relay(f.outbox, publisher, options);
  for (int i = 0; i < 2; ++i) {
    const auto r = relay.run_once();
    EXPECT_EQ(r.refused, 1u);
    EXPECT_EQ(r.parked, 0u);
  }
  EXPECT_EQ(relay.run_once().parked, 1u);
  // Parked: kept with its reason, no longer relayed.
  EXPECT_EQ(relay.run_once().taken, 0u);
  const auto stats = f.outbox->stats();
  EXPECT_EQ(stats.depth, 0u);
  EXPECT_EQ(stats.parked, 1u);
  const auto parked = f.outbox->parked(10);
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].attempts, 3);
  EXPECT_EQ(parked[0].last_error, "refused: no route for order.charged");
  EXPECT_EQ(parked[0].event.id, follow_up_id("billing", "p1", 0));
  // Back in the queue once the cause is fixed.
  publisher->refuse_type.clear();
  EXPECT_EQ(f.outbox->unpark(), 1u);
  EXPECT_EQ(relay.drain(), 1u);
  EXPECT_EQ(f.outbox->stats().parked, 0u);
}

// A relay thread with an hour-long poll interval delivers a follow-up: only the commit's wake
// can have started its pass.
inline void outbox_relay_wakes_on_commit_case(const OutboxFixture& f) {
  auto publisher = std::make_shared<RecordingPublisher>();
  OutboxRelayOptions options;
  options.poll_interval = std::chrono::hours(1);
  OutboxRelay relay(f.outbox, publisher, options);
  relay.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach its wait
  CollectingBusProxy proxy("billing");
  auto handler = charging_handler(f, "billing", 1);
  ASSERT_EQ((*handler)(incoming("w1"), proxy), HandleResult::processed);
  for (int i = 0; i < 1000 && publisher->rows().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  relay.stop();
  ASSERT_EQ(publisher->rows().size(), 1u);
  EXPECT_EQ(publisher->rows()[0].event.id, follow_up_id("billing", "w1", 0));
}

// Several relays drain one outbox at once: every row is published exactly once, and each
// consumer's rows in commit order.
inline void outbox_concurrent_relays_case(const OutboxFixture& f,
                                          const std::vector<std::shared_ptr<Outbox>>& relays_on) {
  CollectingBusProxy proxy;
  const std::vector<std::string> consumers = {"billing", "audit", "mail"};
  constexpr int kEvents = 40;
  for (const auto& consumer : consumers) {
    auto handler = charging_handler(f, consumer, 2);
    for (int i = 0; i < kEvents; ++i)
      ASSERT_EQ((*handler)(incoming("c" + std::to_string(i)), proxy), HandleResult::processed);
  }
  const std::size_t total = consumers.size() * kEvents * 2;
  auto publisher = std::make_shared<RecordingPublisher>();
  std::vector<std::thread> threads;
  std::atomic<std::size_t> published{0};
  for (const auto& outbox : relays_on) {
    threads.emplace_back([&, outbox] {
      OutboxRelayOptions options;
      options.batch_size = 7;
      OutboxRelay relay(outbox, publisher, options);
      for (int pass = 0; pass < 10000 && published.load() < total; ++pass) {
        const auto r = relay.run_once();
        published += r.published;
        if (r.busy || r.taken == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  const auto rows = publisher->rows();
  ASSERT_EQ(rows.size(), total);
  std::set<std::pair<std::string, std::string>> ids;  // (consumer, id): explicit ids repeat
  std::map<std::string, std::int64_t> last_seq;
  for (const auto& row : rows) {
    EXPECT_TRUE(ids.insert({row.consumer, row.event.id}).second)
        << "published twice: " << row.consumer << " " << row.event.id;
    auto& last = last_seq[row.consumer];
    EXPECT_GT(row.seq, last) << "out of order for " << row.consumer;
    last = row.seq;
  }
  EXPECT_EQ(f.outbox->stats().depth, 0u);
}

}  // namespace idem::test
