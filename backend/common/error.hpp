// The project's one error type, for everything a user can cause: bad flags, bad config,
// missing or corrupt files, unsupported feature combinations. Executables catch it at
// main(), print the message and exit with status 2; nothing that a user types should
// end in a crash or a stack dump. Internal invariants use assert-like checks instead.
//
// Messages name the file/key/flag at fault and say what would be valid, e.g.
//   --num-attention-heads 5 must divide --hidden-size 768 (valid: 1, 2, 3, 4, 6, 8, 12, ...)
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace common {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// fail("key {} is unknown", key): formats and throws common::Error.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace common
