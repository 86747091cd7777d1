// Blocking-over-async adapters: an idem::async::AsyncRecorder or AsyncStore seen through the
// blocking protocol (idem::IdempotencyRecorder, idem::IdempotencyStore), so the blocking
// conformance suites (recorder_conformance.hpp, store_conformance.hpp) check an async backend
// case for case: every protocol call of the blocking face is the async object's coroutine, run
// to its end on an io_context the adapter owns, while the calling thread waits.
//
//   auto store = std::make_shared<idem::testing::BlockingOverAsyncStore>(
//       [&](asio::any_io_executor io) {   // the adapter's executor, for the backend's I/O
//         return std::make_shared<MyAsyncStore>(io, options_with(clock));
//       },
//       std::make_shared<MyBlockingStore>(options_with(clock)));  // the operator calls
//
// What is forwarded where:
// * The protocol calls the async face has (the recorder's check / mark / batches / claims /
//   run_transactional; the store's claim / complete / release / renew / lookup / wait, with
//   wait's stop token) run on the async object. run_transactional hands the blocking handler a
//   BlockingOverAsyncTransaction, whose exec / query_int64 / query_text are the async
//   transaction's, awaited by the callback coroutine the async recorder started.
// * The operator calls the async protocol does not have (the recorder's purge, consumer_counts,
//   count_purgeable, purgeable_markers, inspect; the store's purge_expired, counts,
//   entry_count, list, remove) go to a blocking object over the same records: the one given,
//   else the async store's blocking_store(). Without one they throw NotSupported.
// * Keys and arguments are checked by the blocking face's own non-virtual calls first, so a bad
//   key never reaches the async object: the async argument checks are the async suites'.
//
// The io_context. The adapter owns one io_context run by one thread of its own: every coroutine
// of the async object (and, when it was built with the adapter's executor, its socket I/O) runs
// there, one handler at a time; the calling threads only wait. A call made from that thread
// (from a coroutine of the adapter's own loop) would wait for itself: it throws
// std::logic_error. The destructor stops the loop and joins its thread before it lets go of the
// async object (whose shut-down it posts then never runs; it is destroyed with the io_context):
// so the adapter must hold the async object's only reference when the object uses the adapter's
// executor.
//
// Thread safety: any number of threads may call one adapter at once (each waits for its own
// call; their coroutines interleave on the adapter's thread). The exceptions the calls ended
// with are kept until the adapter's thread has been joined (see async_support.hpp: a last
// release on that thread would look to ThreadSanitizer like a free racing with the caller's
// read), so an adapter holds every exception it has thrown until it is destroyed: it is for
// tests, not for production traffic.
//
// Needs idem::async (standalone Asio): link idem::testing_async.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/async/recorder.hpp"
#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::testing {

namespace async_detail {

// An io_context run by one thread of its own, and blocking calls of coroutines on it.
class BlockingLoop {
 public:
  BlockingLoop() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  BlockingLoop(const BlockingLoop&) = delete;
  BlockingLoop& operator=(const BlockingLoop&) = delete;
  ~BlockingLoop() { stop(); }

  asio::io_context::executor_type executor() noexcept { return io_.get_executor(); }

  // A call started on the loop: its outcome, once `done`.
  template <class T>
  struct Pending {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::exception_ptr error;
    std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> value;
  };

  // Starts `task` on the loop.
  template <class T>
  std::shared_ptr<Pending<T>> start(idem::async::Task<T> task) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      throw std::logic_error(
          "a blocking-over-async call made from the adapter's own thread would wait for itself");
    }
    auto pending = std::make_shared<Pending<T>>();
    asio::co_spawn(io_, std::move(task), [pending](std::exception_ptr e, auto&&... v) {
      std::lock_guard lock(pending->mutex);
      pending->error = e;
      if constexpr (sizeof...(v) > 0) {
        if (!e) pending->value.emplace(std::forward<decltype(v)>(v)...);
      }
      pending->done = true;
      pending->done_cv.notify_all();
    });
    return pending;
  }

  // Waits for a started call: its value, or its exception rethrown here.
  template <class T>
  T wait(const std::shared_ptr<Pending<T>>& pending) {
    std::unique_lock lock(pending->mutex);
    pending->done_cv.wait(lock, [&] { return pending->done; });
    if (pending->error) {
      keep(pending->error);
      std::rethrow_exception(pending->error);
    }
    if constexpr (!std::is_void_v<T>) return std::move(*pending->value);
  }

  // Runs `task` on the loop and waits for it.
  template <class T>
  T run(idem::async::Task<T> task) {
    return wait(start(std::move(task)));
  }

  // Stops the loop at once and joins its thread; then lets go of the exceptions kept. What is
  // still queued never runs (it is destroyed with the io_context). Idempotent.
  void stop() {
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
    std::lock_guard lock(kept_mutex_);
    kept_.clear();
  }

 private:
  void keep(const std::exception_ptr& error) {
    std::lock_guard lock(kept_mutex_);
    kept_.push_back(error);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  std::mutex kept_mutex_;
  std::vector<std::exception_ptr> kept_;
};

[[noreturn]] inline void no_operator_object(const char* what, const char* call) {
  throw idem::NotSupported(std::string("the async ") + what + " protocol has no " + call +
                           "(): give the blocking-over-async adapter a blocking " + what +
                           " over the same records");
}

}  // namespace async_detail

// The transaction a blocking handler gets from BlockingOverAsyncRecorder::run_transactional:
// each statement is handed to the callback coroutine the async recorder started (it alone may
// use the async transaction) and awaited there, while the handler's thread waits.
class BlockingOverAsyncTransaction final : public idem::Transaction {
 public:
  using Step = std::function<idem::async::Task<void>(idem::async::AsyncSqlTransaction&)>;

  std::string_view consumer() const noexcept { return consumer_; }
  std::string_view event_id() const noexcept { return event_id_; }

  // How many rows the statement changed (for a query: how many it returned).
  std::int64_t exec(std::string_view sql, std::span<const SqlParam> params = {}) {
    std::int64_t changed = 0;
    perform(
        [sql, params, &changed](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
          changed = co_await tx.exec(sql, params);
        });
    return changed;
  }
  std::int64_t query_int64(std::string_view sql, std::span<const SqlParam> params = {}) {
    std::int64_t result = 0;
    perform(
        [sql, params, &result](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
          result = co_await tx.query_int64(sql, params);
        });
    return result;
  }
  std::optional<std::string> query_text(std::string_view sql,
                                        std::span<const SqlParam> params = {}) {
    std::optional<std::string> result;
    perform(
        [sql, params, &result](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
          result = co_await tx.query_text(sql, params);
        });
    return result;
  }

 private:
  friend class BlockingOverAsyncRecorder;

  // What the handler's thread and the callback coroutine share.
  struct Channel {
    std::mutex mutex;
    std::condition_variable changed;
    bool started = false;   // the callback coroutine runs: steps may be sent
    bool finished = false;  // the async run_transactional has ended
    Step step;              // the next statement, taken by the coroutine
    bool step_done = false;
    std::exception_ptr step_error;
    bool handler_done = false;  // the handler returned (or threw handler_error)
    std::exception_ptr handler_error;
    asio::steady_timer* wake = nullptr;  // the coroutine's, while it waits
    std::optional<asio::any_io_executor> executor;
  };

  BlockingOverAsyncTransaction(std::string consumer, std::string event_id,
                               std::shared_ptr<Channel> channel)
      : consumer_(std::move(consumer)),
        event_id_(std::move(event_id)),
        channel_(std::move(channel)) {}

  // The callback the async recorder runs: serves the handler's statements until it is done.
  static idem::async::Task<void> serve(std::shared_ptr<Channel> channel,
                                       idem::async::AsyncSqlTransaction& tx) {
    const asio::any_io_executor executor = co_await asio::this_coro::executor;
    asio::steady_timer wake(executor);
    {
      std::lock_guard lock(channel->mutex);
      channel->started = true;
      channel->wake = &wake;
      channel->executor = executor;
    }
    channel->changed.notify_all();
    struct Unregister {  // the timer goes with this frame, however the frame ends
      Channel& ch;
      ~Unregister() {
        std::lock_guard lock(ch.mutex);
        ch.wake = nullptr;
      }
    } unregister{*channel};
    for (;;) {
      Step step;
      bool end = false;
      std::exception_ptr handler_error;
      {
        std::lock_guard lock(channel->mutex);
        if (channel->step) {
          step = std::move(channel->step);
          channel->step = nullptr;
        } else if (channel->handler_done) {
          end = true;
          handler_error = channel->handler_error;
        }
      }
      if (end) {
        if (handler_error) std::rethrow_exception(handler_error);  // rolls back
        co_return;
      }
      if (!step) {
        wake.expires_at(asio::steady_timer::time_point::max());
        asio::error_code ignored;
        co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
        continue;
      }
      std::exception_ptr error;
      try {
        co_await step(tx);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(channel->mutex);
        channel->step_done = true;
        channel->step_error = error;
      }
      channel->changed.notify_all();
    }
  }

  // Wakes the callback coroutine (on its executor, where its timer lives).
  static void poke(const std::shared_ptr<Channel>& channel) {
    asio::any_io_executor executor;
    {
      std::lock_guard lock(channel->mutex);
      if (!channel->executor) return;
      executor = *channel->executor;
    }
    asio::post(executor, [channel] {
      std::lock_guard lock(channel->mutex);
      if (channel->wake) channel->wake->cancel();
    });
  }

  void perform(Step step) {
    {
      std::lock_guard lock(channel_->mutex);
      if (channel_->handler_done || channel_->finished) {
        throw std::logic_error("the transaction was used after its handler returned");
      }
      channel_->step = std::move(step);
      channel_->step_done = false;
      channel_->step_error = nullptr;
    }
    poke(channel_);
    std::unique_lock lock(channel_->mutex);
    channel_->changed.wait(lock, [&] { return channel_->step_done || channel_->finished; });
    if (!channel_->step_done) throw idem::StoreError("the transaction ended under the handler");
    if (channel_->step_error) std::rethrow_exception(channel_->step_error);
  }

  std::string consumer_;
  std::string event_id_;
  std::shared_ptr<Channel> channel_;
};

// An AsyncRecorder through the blocking IdempotencyRecorder protocol (see the top of the file).
class BlockingOverAsyncRecorder final : public idem::IdempotencyRecorder {
 public:
  using MakeAsync =
      std::function<std::shared_ptr<idem::async::AsyncRecorder>(asio::any_io_executor)>;

  // Builds the async recorder with `make`, given the adapter's executor (for a backend whose
  // I/O needs one). `operator_recorder`: a blocking recorder over the same markers, for the
  // operator calls (may be null: they throw NotSupported).
  explicit BlockingOverAsyncRecorder(
      const MakeAsync& make, std::shared_ptr<idem::IdempotencyRecorder> operator_recorder = nullptr)
      : loop_(std::make_unique<async_detail::BlockingLoop>()),
        recorder_(make(loop_->executor())),
        operator_(std::move(operator_recorder)) {
    if (!recorder_) throw idem::InvalidArgument("BlockingOverAsyncRecorder: no async recorder");
  }
  // Over an async recorder that needs no executor of the adapter's.
  explicit BlockingOverAsyncRecorder(
      std::shared_ptr<idem::async::AsyncRecorder> recorder,
      std::shared_ptr<idem::IdempotencyRecorder> operator_recorder = nullptr)
      : BlockingOverAsyncRecorder([&recorder](const asio::any_io_executor&) { return recorder; },
                                  std::move(operator_recorder)) {}
  ~BlockingOverAsyncRecorder() override { loop_->stop(); }  // before the recorder goes

  [[nodiscard]] const std::shared_ptr<idem::async::AsyncRecorder>& async_recorder() const noexcept {
    return recorder_;
  }

 protected:
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    return loop_->run(recorder_->is_processed(consumer, event_id));
  }
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    loop_->run(recorder_->mark_processed(consumer, event_id));
  }
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override {
    return loop_->run(recorder_->is_processed_many(consumer, event_ids));
  }
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override {
    loop_->run(recorder_->mark_processed_many(consumer, event_ids));
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override {
    return recorder_->capabilities();
  }
  idem::Claim do_claim(std::string_view consumer, std::string_view event_id,
                       idem::Millis lease) override {
    return loop_->run(recorder_->claim(consumer, event_id, lease));
  }
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override {
    return loop_->run(recorder_->complete(consumer, event_id, token));
  }
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override {
    return loop_->run(recorder_->release(consumer, event_id, token));
  }
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                idem::Millis lease) override {
    return loop_->run(recorder_->renew(consumer, event_id, token, lease));
  }

  // The async run_transactional runs on the loop; when it calls back, the handler runs here, on
  // the calling thread, each of its statements served by the callback coroutine. The handler's
  // exception ends the callback with it (the async recorder rolls back and rethrows it).
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(idem::Transaction&)>& fn) override {
    using Channel = BlockingOverAsyncTransaction::Channel;
    auto channel = std::make_shared<Channel>();
    idem::async::AsyncRecorder::TransactionalFn callback =
        [channel](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
      co_await BlockingOverAsyncTransaction::serve(channel, tx);
    };
    // The async call, started on the loop; its end is told through the channel too.
    auto call = [](idem::async::AsyncRecorder& recorder, std::string c, std::string e,
                   idem::async::AsyncRecorder::TransactionalFn cb,
                   std::shared_ptr<Channel> ch) -> idem::async::Task<bool> {
      struct Finish {
        std::shared_ptr<Channel> ch;
        ~Finish() {
          {
            std::lock_guard lock(ch->mutex);
            ch->finished = true;
          }
          ch->changed.notify_all();
        }
      } finish{ch};
      co_return co_await recorder.run_transactional(c, e, std::move(cb));
    };
    auto pending = loop_->start(call(*recorder_, std::string(consumer), std::string(event_id),
                                     std::move(callback), channel));
    bool ran = false;
    {
      std::unique_lock lock(channel->mutex);
      channel->changed.wait(lock, [&] { return channel->started || channel->finished; });
      ran = channel->started;
    }
    if (ran) {
      BlockingOverAsyncTransaction tx(std::string(consumer), std::string(event_id), channel);
      std::exception_ptr handler_error;
      try {
        fn(tx);
      } catch (...) {
        handler_error = std::current_exception();
      }
      {
        std::lock_guard lock(channel->mutex);
        channel->handler_done = true;
        channel->handler_error = handler_error;
      }
      BlockingOverAsyncTransaction::poke(channel);
    }
    return loop_->wait(pending);
  }

  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    return operator_recorder("purge").purge(older_than, progress);
  }
  std::vector<idem::ConsumerCounts> do_consumer_counts() override {
    return operator_recorder("consumer_counts").consumer_counts();
  }
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override {
    return operator_recorder("count_purgeable").count_purgeable(older_than);
  }
  idem::PurgeableMarkers do_purgeable_markers(
      std::chrono::system_clock::duration older_than) override {
    return operator_recorder("purgeable_markers").purgeable_markers(older_than);
  }
  idem::MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override {
    return operator_recorder("inspect").inspect(consumer, event_id);
  }

 private:
  idem::IdempotencyRecorder& operator_recorder(const char* call) {
    if (!operator_) async_detail::no_operator_object("recorder", call);
    return *operator_;
  }

  std::unique_ptr<async_detail::BlockingLoop> loop_;  // first: destroyed after the recorder
  std::shared_ptr<idem::async::AsyncRecorder> recorder_;
  std::shared_ptr<idem::IdempotencyRecorder> operator_;
};

// An AsyncStore through the blocking IdempotencyStore protocol (see the top of the file).
class BlockingOverAsyncStore final : public idem::IdempotencyStore {
 public:
  using MakeAsync = std::function<std::shared_ptr<idem::async::AsyncStore>(asio::any_io_executor)>;

  // Builds the async store with `make`, given the adapter's executor (for a backend whose I/O
  // needs one). `operator_store`: a blocking store over the same records, for the operator calls
  // (null: the async store's blocking_store(); if that is null too, they throw NotSupported).
  explicit BlockingOverAsyncStore(const MakeAsync& make,
                                  std::shared_ptr<idem::IdempotencyStore> operator_store = nullptr)
      : loop_(std::make_unique<async_detail::BlockingLoop>()),
        store_(make(loop_->executor())),
        operator_(std::move(operator_store)) {
    if (!store_) throw idem::InvalidArgument("BlockingOverAsyncStore: no async store");
    if (!operator_) operator_ = store_->blocking_store();
  }
  // Over an async store that needs no executor of the adapter's.
  explicit BlockingOverAsyncStore(std::shared_ptr<idem::async::AsyncStore> store,
                                  std::shared_ptr<idem::IdempotencyStore> operator_store = nullptr)
      : BlockingOverAsyncStore([&store](const asio::any_io_executor&) { return store; },
                               std::move(operator_store)) {}
  ~BlockingOverAsyncStore() override { loop_->stop(); }  // before the store goes

  [[nodiscard]] const std::shared_ptr<idem::async::AsyncStore>& async_store() const noexcept {
    return store_;
  }

 protected:
  bool do_needs_bytes() const noexcept override { return store_->needs_bytes(); }
  idem::ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              idem::Millis lease) override {
    return loop_->run(store_->claim(key, fingerprint, lease));
  }
  bool do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                   const idem::ExecutionReport& report, idem::Millis ttl) override {
    return loop_->run(store_->complete(key, token, std::move(value), report, ttl));
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    return loop_->run(store_->release(key, token));
  }
  bool do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    return loop_->run(store_->renew(key, token, lease));
  }
  std::optional<idem::IdempotencyRecord> do_lookup(std::string_view key) override {
    return loop_->run(store_->lookup(key));
  }
  std::optional<idem::IdempotencyRecord> do_wait(std::string_view key, idem::SteadyTime deadline,
                                                 std::stop_token stop) override {
    return loop_->run(store_->wait(key, deadline, std::move(stop)));
  }

  std::size_t do_purge_expired(const idem::PurgeProgress& progress) override {
    return operator_store("purge_expired").purge_expired(progress);
  }
  idem::StoreCounts do_counts() override { return operator_store("counts").counts(); }
  std::size_t do_entry_count() override { return operator_store("entry_count").entry_count(); }
  idem::RecordPage do_list(std::string_view prefix, std::size_t limit,
                           std::string_view cursor) override {
    return operator_store("list").list(prefix, limit, cursor);
  }
  bool do_remove(std::string_view key, std::uint64_t token) override {
    return operator_store("remove").remove(key, token);
  }

 private:
  idem::IdempotencyStore& operator_store(const char* call) {
    if (!operator_) async_detail::no_operator_object("store", call);
    return *operator_;
  }

  std::unique_ptr<async_detail::BlockingLoop> loop_;  // first: destroyed after the store
  std::shared_ptr<idem::async::AsyncStore> store_;
  std::shared_ptr<idem::IdempotencyStore> operator_;
};

}  // namespace idem::testing
