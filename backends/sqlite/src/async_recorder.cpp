#include "idem/sqlite/async_recorder.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <utility>

#include "async_offload.hpp"
#include "idem/error.hpp"

namespace idem::sqlite {

using detail::offload;
using detail::Unit;
using idem::async::Task;

namespace {

// The statements a transactional callback (a coroutine on the caller's executor) hands to the
// thread that holds its transaction. The thread serve()s them until the callback has finished.
class StatementQueue {
 public:
  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Notifies under the lock: serve() may return, and its caller destroy the queue, the moment
  // the lock is released.
  void finish(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
    cv_.notify_one();
  }

  // On the transaction's thread: runs statements until the callback finished; its error.
  std::exception_ptr serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
      if (jobs_.empty()) return error_;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool done_ = false;
  std::exception_ptr error_;
};

// AsyncSqlTransaction over the SqliteTransaction a pool thread holds open.
class AsyncSqliteTransaction final : public idem::async::AsyncSqlTransaction {
 public:
  AsyncSqliteTransaction(SqliteTransaction& tx, StatementQueue& queue)
      : AsyncSqlTransaction(tx.consumer(), tx.event_id()), tx_(tx), queue_(queue) {}

 private:
  Task<std::int64_t> do_exec(std::string_view sql, std::span<const SqlParam> params) override {
    const std::function<std::int64_t()> work = [this, sql, params] {
      return tx_.exec(sql, params);
    };
    co_return co_await offload<std::int64_t>(queue_, work);
  }

  Task<std::int64_t> do_query_int64(std::string_view sql,
                                    std::span<const SqlParam> params) override {
    const std::function<std::optional<std::int64_t>()> work = [this, sql, params] {
      return tx_.query_int64(sql, params);
    };
    const auto value = co_await offload<std::optional<std::int64_t>>(queue_, work);
    if (!value) {
      throw StoreError("query_int64: the query returned no row (or NULL): " +
                       std::string(sql.substr(0, 80)));
    }
    co_return *value;
  }

  Task<std::optional<std::string>> do_query_text(std::string_view sql,
                                                 std::span<const SqlParam> params) override {
    const std::function<std::optional<std::string>()> work = [this, sql, params] {
      return tx_.query_text(sql, params);
    };
    co_return co_await offload<std::optional<std::string>>(queue_, work);
  }

  SqliteTransaction& tx_;
  StatementQueue& queue_;
};

}  // namespace

AsyncSqliteRecorder::AsyncSqliteRecorder(std::string path, SqliteOptions options,
                                         AsyncSqliteOptions async_options)
    : recorder_(std::make_shared<SqliteIdempotencyRecorder>(std::move(path), std::move(options))),
      pool_(detail::make_worker_pool(async_options.threads)) {}

AsyncSqliteRecorder::AsyncSqliteRecorder(std::shared_ptr<SqliteIdempotencyRecorder> recorder,
                                         AsyncSqliteOptions async_options)
    : recorder_(std::move(recorder)) {
  if (!recorder_) throw InvalidArgument("AsyncSqliteRecorder: the recorder is null");
  pool_ = detail::make_worker_pool(async_options.threads);
}

AsyncSqliteRecorder::~AsyncSqliteRecorder() = default;

Task<bool> AsyncSqliteRecorder::do_is_processed(std::string_view consumer,
                                                std::string_view event_id) {
  const std::function<bool()> work = [this, consumer, event_id] {
    return recorder_->is_processed(consumer, event_id);
  };
  co_return co_await offload<bool>(*pool_, work);
}

Task<void> AsyncSqliteRecorder::do_mark_processed(std::string_view consumer,
                                                  std::string_view event_id) {
  const std::function<Unit()> work = [this, consumer, event_id] {
    recorder_->mark_processed(consumer, event_id);
    return Unit{};
  };
  co_await offload<Unit>(*pool_, work);
}

Task<std::vector<bool>> AsyncSqliteRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  const std::function<std::vector<bool>()> work = [this, consumer, event_ids] {
    return recorder_->is_processed_many(consumer, event_ids);
  };
  co_return co_await offload<std::vector<bool>>(*pool_, work);
}

Task<void> AsyncSqliteRecorder::do_mark_processed_many(std::string_view consumer,
                                                       std::span<const std::string> event_ids) {
  const std::function<Unit()> work = [this, consumer, event_ids] {
    recorder_->mark_processed_many(consumer, event_ids);
    return Unit{};
  };
  co_await offload<Unit>(*pool_, work);
}

Task<Claim> AsyncSqliteRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                          Millis lease) {
  const std::function<Claim()> work = [this, consumer, event_id, lease] {
    return recorder_->claim(consumer, event_id, lease);
  };
  co_return co_await offload<Claim>(*pool_, work);
}

Task<bool> AsyncSqliteRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                            std::uint64_t token) {
  const std::function<bool()> work = [this, consumer, event_id, token] {
    return recorder_->complete(consumer, event_id, token);
  };
  co_return co_await offload<bool>(*pool_, work);
}

Task<bool> AsyncSqliteRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token) {
  // Never withdrawn: a cancelled handler's cleanup must still give its claim back.
  const std::function<bool()> work = [this, consumer, event_id, token] {
    return recorder_->release(consumer, event_id, token);
  };
  co_return co_await offload<bool>(*pool_, work, nullptr, /*withdrawable=*/false);
}

Task<bool> AsyncSqliteRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                         std::uint64_t token, Millis lease) {
  const std::function<bool()> work = [this, consumer, event_id, token, lease] {
    return recorder_->renew(consumer, event_id, token, lease);
  };
  co_return co_await offload<bool>(*pool_, work);
}

Task<bool> AsyncSqliteRecorder::do_run_transactional(std::string_view consumer,
                                                     std::string_view event_id,
                                                     TransactionalFn fn) {
  auto executor = co_await asio::this_coro::executor;
  // The callback's own cancellation: the caller's, forwarded while the transaction runs.
  auto cancel = std::make_shared<asio::cancellation_signal>();
  const std::function<void(asio::cancellation_type)> forward =
      [cancel](asio::cancellation_type type) { cancel->emit(type); };
  const std::function<bool()> work = [this, consumer, event_id, &fn, executor, cancel] {
    return recorder_->run_transactional(consumer, event_id, [&](Transaction& tx) {
      StatementQueue queue;
      AsyncSqliteTransaction async_tx(static_cast<SqliteTransaction&>(tx), queue);
      auto callback = [](TransactionalFn& f, idem::async::AsyncSqlTransaction& t) -> Task<void> {
        co_await f(t);
      };
      asio::co_spawn(executor, callback(fn, async_tx),
                     asio::bind_cancellation_slot(
                         cancel->slot(), [&queue](std::exception_ptr e) { queue.finish(e); }));
      if (auto error = queue.serve()) std::rethrow_exception(error);  // rolls back
    });
  };
  co_return co_await offload<bool>(*pool_, work, &forward);
}

}  // namespace idem::sqlite
