// `idem stats`, `idem purge` and `idem inspect`: operator commands on a recorder and a store
// named by a URL (idem/open.hpp), e.g. sqlite:///var/lib/app/idem.db or redis://cache:6379/0.
//
//   idem stats URL [--format text|json|prometheus]
//                                                markers and live claims per consumer; store
//                                                records by state ("none" for an absent face);
//                                                --json is --format json
//   idem purge URL --older-than 7d [--store-only|--recorder-only] [--dry-run]
//                                                markers older than the duration and expired
//                                                store records; progress on stderr
//   idem inspect URL KEY [--consumer NAME] [--json]
//                                                a store record, or (with --consumer) an event's
//                                                marker and claim
//
// Exit codes: 0 ok, 1 not found (inspect), 2 usage or configuration error (a bad URL, key or
// duration), 3 store error (unreachable server, unreadable file, corrupt record). Messages go to
// stderr and never contain a password (idem::redact_url, and any password of the URL is masked
// in backend messages too). stats and inspect never create tables: SQLite files are opened
// read-only and PostgreSQL schemas are not created; purge writes only to faces that exist.
// See docs/cli.md.
#pragma once

namespace CLI {
class App;
}

namespace idem::cli {

// Adds the subcommands `stats`, `purge` and `inspect` to `app`. Each runs from its CLI11
// callback and ends the parse with CLI::RuntimeError(code) when its exit code is not 0, so
// main()'s CLI11_PARSE returns that code.
void add_store_commands(CLI::App& app);

}  // namespace idem::cli
