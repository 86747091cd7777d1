// The exit codes of every `idem` command (docs/cli.md), and the one line an error is printed as.
#pragma once

#include <exception>
#include <string>

namespace idem::cli {

constexpr int kOk = 0;
constexpr int kNotFound = 1;      // inspect: no record, marker or claim; no store at the URL
constexpr int kUsage = 2;         // a bad command line, URL, duration or key; a missing backend
constexpr int kStoreFailure = 3;  // the store failed: unreachable, unreadable, corrupt
constexpr int kRefused = 4;       // release: the record is live or completed; nothing changed

// The exit code for an error a command let escape: kUsage for bad input (idem::InvalidArgument
// and its kinds, idem::NotSupported, a path that is not what it must be:
// std::filesystem::filesystem_error), kStoreFailure for anything else.
int exit_code_of(const std::exception& error) noexcept;

// The error as the text after "idem COMMAND: ": "<code_name>: <message>" for an idem::Error
// (never the "idem: " prefix of what(), which the command's own prefix replaces), with
// " (retryable)" when trying again may help; "invalid_argument: <reason>: '<path>'" for a
// std::filesystem::filesystem_error; what() for any other exception.
std::string describe(const std::exception& error);

}  // namespace idem::cli
