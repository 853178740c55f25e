// Config values as they appear on a command line or in a scheduler directive: the one place
// that turns a resolved scalar into text for the stages and clusters.
//   int → "42", float → shortest round-trip form ("0.0006", "6e-05"), bool → "true"/"false",
//   string → itself; lists and maps are an error naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "launcher/config/node.hpp"

namespace launcher {

std::string scalar_text(const Node& value, std::string_view key);

// The value at a dotted path below root, or nullptr when it is absent or null.
const Node* find_set(const Node& root, std::string_view path);

// `key` of a config section (e.g. section `training`, key `model.num_layers`) as text or as an
// integer, `fallback` when absent or null; a wrong type is a common::Error naming
// "<section_name>.<key>".
std::string text_or(const Node& section, std::string_view section_name, std::string_view key,
                    std::string fallback);
int64_t integer_or(const Node& section, std::string_view section_name, std::string_view key,
                   int64_t fallback);

}  // namespace launcher
