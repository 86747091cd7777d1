// Text from the outside (a URL, a parameter's value) made safe to quote in a message.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idem::detail {

// `text` with control characters as \xNN, cut to `limit` characters ("...").
std::string printable(std::string_view text, std::size_t limit = 256);

}  // namespace idem::detail
