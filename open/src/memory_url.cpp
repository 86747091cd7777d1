// memory:// and memory: — the in-process recorder and store. Their options differ by face.
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "scheme.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::detail {
namespace {

std::vector<QueryParameter> memory_parameters(const UrlContext& context, std::string_view rest) {
  const auto [location, query] = split_query(rest);
  // "memory:", "memory://": there is nothing to locate.
  if (!location.empty() && location != "//") {
    context.fail(location.substr(0, 2) == "//" ? "host or path" : "path",
                 "memory URLs name no host and no path: write memory:// (with an optional "
                 "?query)");
  }
  return parse_query(context, query);
}

InMemoryRecorderOptions memory_recorder_options(const UrlContext& context, std::string_view rest,
                                                const OpenOptions& open) {
  InMemoryRecorderOptions options;
  options.clock = open.clock;
  for (const QueryParameter& parameter : memory_parameters(context, rest)) {
    if (parameter.name == "shards") {
      options.shards = count_value(context, parameter, 1, kMaxShards);
    } else if (parameter.name == "expected_markers") {
      options.expected_markers = count_value(context, parameter, 0, kMaxExpectedMarkers);
    } else {
      unknown_parameter(context, parameter, "a memory:// recorder", "shards, expected_markers");
    }
  }
  return options;
}

InMemoryStoreOptions memory_store_options(const UrlContext& context, std::string_view rest,
                                          const OpenOptions& open) {
  InMemoryStoreOptions options;
  options.clock = open.clock;
  for (const QueryParameter& parameter : memory_parameters(context, rest)) {
    if (parameter.name == "capacity") {
      options.capacity = count_value(context, parameter, 1, kMaxCount);
    } else if (parameter.name == "when_full") {
      using WhenFull = InMemoryStoreOptions::WhenFull;
      options.when_full =
          choice_value<WhenFull>(context, parameter,
                                 {{"reject", WhenFull::reject},
                                  {"evict_oldest_completed", WhenFull::evict_oldest_completed}});
    } else if (parameter.name == "shards") {
      options.shards = count_value(context, parameter, 1, kMaxShards);
    } else {
      unknown_parameter(context, parameter, "a memory:// store", "capacity, when_full, shards");
    }
  }
  return options;
}

}  // namespace

OpenPlan memory_url(const UrlContext& context, const SplitUrl& split, OpenFace face,
                    const OpenOptions& options) {
  if (face == OpenFace::outbox) return {.recorder = nullptr, .store = nullptr, .outbox = nullptr};
  if (face == OpenFace::recorder) {
    return {.recorder =
                [o = memory_recorder_options(context, split.rest, options)] {
                  return std::make_shared<InMemoryIdempotencyRecorder>(o);
                },
            .store = nullptr,
            .outbox = nullptr};
  }
  return {.recorder = nullptr,
          .store =
              [o = memory_store_options(context, split.rest, options)] {
                return std::make_shared<InMemoryIdempotencyStore>(o);
              },
          .outbox = nullptr};
}

}  // namespace idem::detail
