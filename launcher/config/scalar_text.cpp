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

std::string text_or(const Node& section, std::string_view section_name, std::string_view key,
                    std::string fallback) {
  const Node* value = find_set(section, key);
  return value == nullptr ? fallback : scalar_text(*value, fmt::format("{}.{}", section_name, key));
}

int64_t integer_or(const Node& section, std::string_view section_name, std::string_view key,
                   int64_t fallback) {
  const Node* value = find_set(section, key);
  return value == nullptr ? fallback : value->as_int(fmt::format("{}.{}", section_name, key));
}

}  // namespace launcher
