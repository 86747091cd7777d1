// A recorder with a transactional mode, for the unit tests of the handler's transactional mode
// (handler_test.cpp, crash_points_test.cpp): the memory recorder's markers, and a transaction of
// the test's own type whose writes are kept only when the handler returns, with the marker — the
// contract of run_transactional, as a database keeps it.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string_view>

#include "idem/memory_recorder.hpp"
#include "idem/recorder.hpp"

namespace idem::test {

// `Tx` (an idem::Transaction) is what the handler writes through; commit() keeps its writes.
template <class Tx>
class InMemoryTransactionalRecorder : public idem::IdempotencyRecorder {
 protected:
  // Called under the recorder's lock once the handler has returned and the event is marked: the
  // writes of `tx` become visible. A throw from the handler leaves neither marker nor writes.
  virtual void commit(Tx& tx) = 0;

 private:
  bool do_is_processed(std::string_view c, std::string_view e) override {
    return markers_.is_processed(c, e);
  }
  void do_mark_processed(std::string_view c, std::string_view e) override {
    markers_.mark_processed(c, e);
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override {
    return {.transactions = true};
  }
  bool do_run_transactional(std::string_view c, std::string_view e,
                            const std::function<void(idem::Transaction&)>& fn) override {
    std::lock_guard lock(mutex_);
    if (markers_.is_processed(c, e)) return false;
    Tx tx;
    fn(tx);
    markers_.mark_processed(c, e);
    commit(tx);
    return true;
  }
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    return markers_.purge(older_than, progress);
  }

  std::mutex mutex_;
  idem::InMemoryIdempotencyRecorder markers_;
};

}  // namespace idem::test
