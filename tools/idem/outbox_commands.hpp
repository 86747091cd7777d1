// `idem relay` and the outbox part of `idem stats`: the outbox (idem/outbox.hpp) of the recorder
// database at a store URL.
//
//   idem relay --store URL --broker amqp://... [--exchange NAME] [--once] [--batch N]
//              [--poll 1s] [--max-attempts N]
//       publishes the committed outbox rows at URL (sqlite:..., postgresql://...) to RabbitMQ with
//       publisher confirms until SIGINT/SIGTERM (or, with --once, until the outbox is empty),
//       then prints what it did. Exit codes as the store commands (docs/cli.md).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "idem/outbox.hpp"
#include "idem/recorder.hpp"

namespace CLI {
class App;
}

namespace idem::cli {

// The outbox on the database of `recorder` (a SQLite or PostgreSQL recorder); null for other
// backends. With look_only, nothing is created: null (and `absent` says why) when the outbox
// table does not exist.
std::shared_ptr<Outbox> outbox_of(const std::shared_ptr<IdempotencyRecorder>& recorder,
                                  bool look_only, std::string* absent = nullptr);

// Adds the subcommand `relay` to `app` (run from its callback, as the store commands).
void add_outbox_commands(CLI::App& app);

}  // namespace idem::cli
