// Scalars as command-line text; see scalar_text.hpp.
#include "launcher/config/scalar_text.hpp"

#include <fmt/format.h>

#include "backend/common/error.hpp"

namespace launcher {

std::string scalar_text(const Node& value, std::string_view key) {
  if (value.is_bool()) return value.as_bool() ? "true" : "false";
  if (value.is_int()) return fmt::format("{}", value.as_int());
  if (value.is_float()) return fmt::format("{}", value.as_double());
  if (value.is_string()) return value.as_string();
  common::fail("{}: expected a single value (number, string or boolean), got a {}", key,
               kind_name(value.kind()));
}

const Node* find_set(const Node& root, std::string_view path) {
  const Node* value = find(root, path);
  return value == nullptr || value->is_null() ? nullptr : value;
}

}  // namespace launcher
