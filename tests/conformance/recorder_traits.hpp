// What the recorder factories of tests/conformance declare to the suites, written once. Every
// recorder here supports claims; it supports transactions or not, and may race another number of
// ids than the suite's default (fewer on a server, where each id is a few round trips per
// thread).
//
//   struct MyFactory : idem::test::RecorderTraits<true, 100> { ... make(clock) ... };
//   struct MyAsyncFactory : idem::test::AsyncRecorderTraits<false> { ... make() ... };
#pragma once

#include "idem/async/recorder.hpp"

namespace idem::test {

// For the blocking recorder suite (idem/testing/recorder_conformance.hpp): kSupportsClaims,
// kSupportsTransactions and, unless ConcurrentIds is 0 (the suite's default), kConcurrentIds.
template <bool Transactions, int ConcurrentIds = 0>
struct RecorderTraits;

template <bool Transactions>
struct RecorderTraits<Transactions, 0> {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = Transactions;
};

template <bool Transactions, int ConcurrentIds>
struct RecorderTraits : RecorderTraits<Transactions, 0> {
  static constexpr int kConcurrentIds = ConcurrentIds;
};

// For the async recorder suite (idem/testing/async_recorder_conformance.hpp): kCapabilities.
template <bool Transactions>
struct AsyncRecorderTraits {
  static constexpr idem::async::RecorderCapabilities kCapabilities{.claims = true,
                                                                   .transactions = Transactions};
};

}  // namespace idem::test
