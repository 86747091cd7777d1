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
#include <string_view>

#include "idem/outbox.hpp"

namespace CLI {
class App;
}

namespace idem::cli {

// The outbox of the database at store URL `url` (open_outbox); null, and `absent` says why, for a
// backend without one (memory, redis, sqlite::memory:). With look_only, nothing is created: null
// too when the outbox table does not exist.
std::shared_ptr<Outbox> outbox_of(std::string_view url, bool look_only,
                                  std::string* absent = nullptr);

// Adds the subcommand `relay` to `app` (run from its callback, as the store commands).
void add_outbox_commands(CLI::App& app);

}  // namespace idem::cli
