// `idem list` and `idem release`: the records of idempotent operations in the store at a URL, by
// the key the operation's function returned.
//
//   idem list URL [--operation NAME | --scope SCOPE] [--prefix P] [--limit N] [--cursor C]
//                 [--json]
//       the records whose key starts with P (with --operation, the keys of that operation), at
//       most N (default 100) in one run: user's key, scope, state, token, lease end (in progress)
//       or expiry (completed); a cursor to continue with when more follow.
//   idem release URL KEY [--operation NAME | --scope SCOPE] [--force] [--delete-completed]
//       clears an abandoned claim (its lease ended: the store confirms it by taking the claim
//       over, then releases it); --force clears a live one, fencing its holder off;
//       --delete-completed deletes a completed result (its key runs again).
//
// Exit codes as the other store commands (docs/cli.md), and 4 when release refused to touch the
// record (a live claim without --force, a result without --delete-completed).
#pragma once

namespace CLI {
class App;
}

namespace idem::cli {

// Adds the subcommands `list` and `release` to `app` (run from their callbacks, as the store
// commands).
void add_record_commands(CLI::App& app);

}  // namespace idem::cli
