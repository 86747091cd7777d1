// Delivering to a coroutine handler from a blocking transport: the in-process Bus
// (idem/bus.hpp) and the RabbitMQ consumer (idem/rabbitmq/consumer.hpp).
//
// on_executor(handler, executor) is an EventHandler (the interface both transports call) that
// runs each delivery as a coroutine on `executor` — handler->handle_event, or handle_batch for a
// window — and makes the transport's thread wait for the coroutine's result before it acks or
// nacks: a returned HandleResult acks, a thrown error (AlreadyInProgress, the handler's own,
// a cancellation) is rethrown on the transport's thread, so the Bus redelivers or dead-letters
// and the RabbitMQ consumer nacks exactly as for a blocking handler. The transport's threads
// (the Bus's workers, the consumer's socket thread) never run the coroutine; the executor's
// threads never block for the transport.
//
// The executor must be running (e.g. io_context::run on some thread) for deliveries to
// complete; a delivery waits for it. Never pass an executor whose only thread is the
// transport's own (it would wait for itself).
//
//   asio::io_context io;
//   auto work = asio::make_work_guard(io);
//   std::thread loop([&] { io.run(); });
//   idem::async::subscribe(bus, "order.placed", handler, io.get_executor());
//
// Thread safety: the adapter may be called from any number of transport threads at once.
#pragma once

#include <asio/any_io_executor.hpp>
#include <memory>
#include <string>

#include "idem/async/handler.hpp"
#include "idem/bus.hpp"
#include "idem/handler.hpp"

namespace idem::async {

// An EventHandler that runs `handler` on `executor` (handler not null: InvalidArgument).
std::shared_ptr<EventHandler> on_executor(std::shared_ptr<AsyncEventHandler> handler,
                                          asio::any_io_executor executor);

// bus.subscribe(event_type, on_executor(handler, executor)).
void subscribe(Bus& bus, std::string event_type, std::shared_ptr<AsyncEventHandler> handler,
               asio::any_io_executor executor);

}  // namespace idem::async
