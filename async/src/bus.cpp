#include "idem/async/bus.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <utility>

#include "idem/error.hpp"

namespace idem::async {

namespace {

class ExecutorHandler final : public EventHandler {
 public:
  ExecutorHandler(std::shared_ptr<AsyncEventHandler> handler, asio::any_io_executor executor)
      : handler_(std::move(handler)), executor_(std::move(executor)) {}

  const std::string& consumer() const noexcept override { return handler_->consumer(); }

  HandleResult operator()(const Event& event, BusProxy& bus) override {
    // The transport's thread waits here; event and bus outlive the coroutine.
    return asio::co_spawn(executor_, handler_->handle_event(event, bus), asio::use_future).get();
  }

  std::vector<HandleOutcome> handle_batch(std::span<const Event> events, BusProxy& bus) override {
    return asio::co_spawn(executor_, handler_->handle_batch(events, bus), asio::use_future).get();
  }

 private:
  std::shared_ptr<AsyncEventHandler> handler_;
  asio::any_io_executor executor_;
};

}  // namespace

std::shared_ptr<EventHandler> on_executor(std::shared_ptr<AsyncEventHandler> handler,
                                          asio::any_io_executor executor) {
  if (!handler) throw InvalidArgument("on_executor: the handler is null");
  if (!executor) throw InvalidArgument("on_executor: the executor is empty");
  return std::make_shared<ExecutorHandler>(std::move(handler), std::move(executor));
}

void subscribe(Bus& bus, std::string event_type, std::shared_ptr<AsyncEventHandler> handler,
               asio::any_io_executor executor) {
  bus.subscribe(std::move(event_type), on_executor(std::move(handler), std::move(executor)));
}

}  // namespace idem::async
