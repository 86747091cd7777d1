#include "idem/open.hpp"

#include <string>
#include <string_view>

#include "idem/error.hpp"
#include "scheme.hpp"
#include "url.hpp"

namespace idem {
namespace {

using detail::OpenFace;
using detail::OpenPlan;
using detail::UrlContext;

// Everything a URL asks for, parsed and checked, before anything is opened: open_recorder,
// open_store and open_outbox share the parsing and differ only in the face they construct.
OpenPlan plan(const UrlContext& context, OpenFace face, const OpenOptions& options) {
  const detail::SplitUrl split = detail::split_scheme(context);
  for (const detail::Scheme& scheme : detail::schemes()) {
    for (std::string_view name : scheme.names) {
      if (split.scheme != name) continue;
      if (scheme.parse == nullptr) {
        std::string option = "IDEM_WITH_";
        for (char c : scheme.part)
          option += static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
        context.not_built(split.scheme, scheme.title, option, scheme.package);
      }
      return scheme.parse(context, split, face, options);
    }
  }
  context.fail("scheme", "'" + detail::printable(split.scheme, 32) +
                             "' is not supported (expected " + detail::known_schemes() + ")");
}

}  // namespace

namespace detail {
void check_open_url(std::string_view url, OpenFace face) {
  const UrlContext context(url);
  (void)plan(context, face, OpenOptions{});
}
}  // namespace detail

std::shared_ptr<IdempotencyRecorder> open_recorder(std::string_view url,
                                                   const OpenOptions& options) {
  const UrlContext context(url);
  OpenPlan planned = plan(context, OpenFace::recorder, options);
  return detail::with_context(context, planned.recorder);
}

std::shared_ptr<IdempotencyStore> open_store(std::string_view url, const OpenOptions& options) {
  const UrlContext context(url);
  OpenPlan planned = plan(context, OpenFace::store, options);
  return detail::with_context(context, planned.store);
}

std::shared_ptr<Outbox> open_outbox(std::string_view url, const OpenOptions& options) {
  const UrlContext context(url);
  OpenPlan planned = plan(context, OpenFace::outbox, options);
  if (!planned.outbox) {
    throw NotSupported("open_outbox: " + detail::split_scheme(context).scheme +
                       ": URLs name a backend without an outbox (an outbox lives in the "
                       "recorder's SQL database: sqlite or postgresql URLs; URL '" +
                       redact_url(url) + "')");
  }
  return detail::with_context(context, planned.outbox);
}

}  // namespace idem
