// What the unit tests of the memory and SQLite recorders (memory_recorder_test.cpp,
// sqlite_recorder_test.cpp) check of a recorder's arguments: a lease that is not positive and a
// negative purge age are refused.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "idem/error.hpp"
#include "idem/recorder.hpp"

namespace idem::test {

// claim() and renew() refuse a lease of zero or less, purge() a negative age, all with
// InvalidArgument. Returns the claim renew() was given: `event_id` stays claimed, a lease of 1 s.
inline idem::Claim expect_bad_leases_and_ages_refused(idem::IdempotencyRecorder& recorder,
                                                      const std::string& consumer,
                                                      const std::string& event_id) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  EXPECT_THROW(static_cast<void>(recorder.claim(consumer, event_id, milliseconds(0))),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(recorder.claim(consumer, event_id, milliseconds(-5))),
               idem::InvalidArgument);
  const idem::Claim claim = recorder.claim(consumer, event_id, seconds(1));
  EXPECT_THROW(static_cast<void>(recorder.renew(consumer, event_id, claim.token, milliseconds(0))),
               idem::InvalidArgument);
  EXPECT_THROW(recorder.purge(seconds(-1)), idem::InvalidArgument);
  return claim;
}

}  // namespace idem::test
