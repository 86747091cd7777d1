// The names idem's RabbitMQ tests use, brought in with `using namespace
// idem::test::rabbitmq_names;` instead of a list of using-declarations in every file.
#pragma once

#include <chrono>

#include "idem/event.hpp"
#include "idem/event_handler.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/options.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_test_handlers.hpp"

namespace idem::test::rabbitmq_names {

using idem::BusProxy;
using idem::Event;
using idem::HandleResult;
using idem::rabbitmq::Consumer;
using idem::rabbitmq::ExchangeType;
using idem::rabbitmq::Publisher;
using idem::test::consume_until;
using idem::test::FnHandler;
using idem::test::SideEffects;
using namespace std::chrono_literals;

}  // namespace idem::test::rabbitmq_names
