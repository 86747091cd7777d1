// Secrets kept out of URLs: a password or key passphrase given inline, read from a file, or read
// from an environment variable, chosen once for every backend and transport (PostgreSQL,
// Redis, RabbitMQ) so they agree on the rules:
//   * at most one of the three sources may be set (ConfigError naming both otherwise);
//   * a file's content is the secret, minus one trailing "\n" (or "\r\n"), so `echo pw > file`
//     works; an empty result, a NUL byte, or a file that cannot be read is a ConfigError naming
//     the file, never its content;
//   * an environment variable that is unset or empty is a ConfigError naming the variable.
// Messages never contain the secret.
//
// Thread-safety: the functions are reentrant (getenv is not synchronised with setenv: do not
// change the environment while a connection is being opened).
#pragma once

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem::detail {

inline std::string read_secret_file(std::string_view what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    throw ConfigError(std::string(what) + ": cannot read the file '" + path +
                      "': " + (error != 0 ? std::strerror(error) : "open failed"));
  }
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(std::string(what) + ": reading the file '" + path + "' failed");
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) throw ConfigError(std::string(what) + ": the file '" + path + "' is empty");
  if (secret.find('\0') != std::string::npos)
    throw ConfigError(std::string(what) + ": the file '" + path + "' contains a NUL byte");
  return secret;
}

inline std::string read_secret_env(std::string_view what, const std::string& name) {
  const char* value = name.empty() ? nullptr : std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') {
    throw ConfigError(std::string(what) + ": the environment variable '" + name +
                      "' is unset or empty");
  }
  return value;
}

// The secret from whichever of `inline_value`, `file` and `env` is set (nullopt when none is).
// `what` names the option family in messages, e.g. "PostgresOptions::password".
inline std::optional<std::string> resolve_secret(std::string_view what,
                                                 const std::string& inline_value,
                                                 const std::string& file, const std::string& env) {
  const int given = (inline_value.empty() ? 0 : 1) + (file.empty() ? 0 : 1) + (env.empty() ? 0 : 1);
  if (given > 1) {
    throw ConfigError(std::string(what) +
                      ": give the secret one way only (inline, _file or _env), not " +
                      std::to_string(given));
  }
  if (!file.empty()) return read_secret_file(std::string(what) + "_file", file);
  if (!env.empty()) return read_secret_env(std::string(what) + "_env", env);
  if (!inline_value.empty()) return inline_value;
  return std::nullopt;
}

}  // namespace idem::detail
