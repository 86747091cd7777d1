// redis:// and rediss:// (TLS) — idem::redis. RedisOptions::from_url parses the URL; this checks
// what it cannot report without quoting a secret.
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "scheme.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::detail {
namespace {

redis::RedisOptions redis_options(const UrlContext& context, const SplitUrl& split,
                                  const OpenOptions& open) {
  // Checked here, not by from_url: its message would quote the start of the URL, and without
  // "//" a password cannot be told apart to be redacted.
  if (split.rest.substr(0, 2) != "//") {
    context.fail("authority",
                 "a Redis URL starts with " + split.scheme + ":// (e.g. redis://localhost:6379/0)");
  }
  // RedisOptions::from_url parses the rest (it wants the scheme in lower case).
  const std::string url = split.scheme + ":" + std::string(split.rest);
  redis::RedisOptions options =
      with_context(context, [&] { return redis::RedisOptions::from_url(url); });
  options.clock = open.clock;
  return options;
}

}  // namespace

OpenPlan redis_url(const UrlContext& context, const SplitUrl& split, OpenFace /*face*/,
                   const OpenOptions& options) {
  const redis::RedisOptions parsed = redis_options(context, split, options);
  return {
      .recorder = [parsed] { return std::make_shared<redis::RedisIdempotencyRecorder>(parsed); },
      .store = [parsed] { return std::make_shared<redis::RedisIdempotencyStore>(parsed); },
      .outbox = nullptr};  // Redis has no transactions a handler's follow-ups could join
}

}  // namespace idem::detail
