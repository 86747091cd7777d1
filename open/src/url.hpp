// Internal: idem::open's side of the URL toolkit (url/idem_url.hpp, shared with the Redis backend
// and the RabbitMQ transport) — the URL being opened, which words every message, and the checks
// every scheme shares.
#pragma once

#include <string_view>

#include "idem/detail/printable.hpp"
#include "idem_url.hpp"

namespace idem::detail {

// The URL being opened, for messages: "<part>: <problem> (URL '<redacted>')". They name the URL's
// parts and parameters, never the function or the options struct behind them (a CLI user never
// called open_store).
class UrlContext final : public UrlErrors {
 public:
  explicit UrlContext(std::string_view url) : url_(url) {}

  std::string_view url() const noexcept { return url_; }

  // fail(part, problem) throws ConfigError "<part>: <problem> (URL '<redacted url>')".
  // Throws NotSupported for a scheme whose backend was not built.
  [[noreturn]] void not_built(std::string_view scheme, std::string_view backend,
                              std::string_view cmake_option, std::string_view package) const;
  // A backend's ConfigError message, in the URL's words (its options struct not named) and
  // scrubbed of every secret the URL holds (libpq quotes the URL it could not parse, password
  // included).
  [[noreturn]] void rethrow_backend_config_error(std::string_view message) const;

 private:
  void throw_error(std::string_view part, std::string_view problem) const override;

  std::string_view url_;
};

// The URL split at its first ':' after checks every scheme shares (not empty, not too long, no
// control characters or spaces, no fragment, a well-formed scheme).
SplitUrl split_scheme(const UrlContext& context);

// Parses and checks `url` as open_recorder / open_store would, opening nothing (no file, no
// connection). Throws what they throw for a bad URL (ConfigError, NotSupported). For tests and
// the URL fuzzer.
enum class OpenFace { recorder, store, outbox };
void check_open_url(std::string_view url, OpenFace face);

}  // namespace idem::detail
