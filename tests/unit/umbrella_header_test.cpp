// <idem/idem.hpp> brings the whole blocking core: an idempotent handler on the in-process
// recorder and a keyed resilient call on the in-process store, with nothing else included.
#include "idem/idem.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace {

TEST(UmbrellaHeader, BothFacesWithOneInclude) {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  int runs = 0;
  auto handler = idem::make_idempotent_handler(
      "billing", recorder, [&](const std::string&) { ++runs; },
      idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
  idem::CollectingBusProxy bus("billing");
  const idem::Event event = idem::Event::make("order.placed", "{}");
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
  EXPECT_EQ(runs, 1);

  int calls = 0;
  auto charge = idem::resilient(
      [&](int cents) {
        ++calls;
        return cents * 2;
      },
      {.name = "charge",
       .idempotency_key = [](int cents) { return "charge:" + std::to_string(cents); }});
  EXPECT_EQ(charge(21).value, 42);
  EXPECT_EQ(charge(21).value, 42);
  EXPECT_EQ(calls, 1);
}

}  // namespace
