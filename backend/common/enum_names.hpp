// The names a setting's enum is written under on command lines, in records and in dumps
// (Megatron's spellings: "LayerNorm", "rope", "selective"), kept beside the enum as a table of
// {value, name} rows. The first row of a value is the name it is written under; later rows are
// other spellings read as the same value (Megatron-DeepSpeed's "layernorm"). A value written as
// "" is Megatron's None. An enum joins by declaring `enum_names(Enum)` next to it, found by
// argument-dependent lookup, returning its table.
// Reference: Megatron-LM's argparse choices (megatron/training/arguments.py), whose strings these
// names are.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend/common/error.hpp"

namespace common {

template <typename Enum>
struct EnumName {
  Enum value;
  std::string_view name;
};

// The name `value` is written under: its first row's ("" where the table has none).
template <typename Enum>
constexpr std::string_view enum_name(Enum value) {
  for (const EnumName<Enum>& row : enum_names(value)) {
    if (row.value == value) return row.name;
  }
  return {};
}

// The value a name (any of its spellings) stands for; std::nullopt for a name not in the table.
template <typename Enum>
constexpr std::optional<Enum> enum_from_name(std::string_view name) {
  for (const EnumName<Enum>& row : enum_names(Enum{})) {
    if (row.name == name) return row.value;
  }
  return std::nullopt;
}

// The value `name` stands for, or a common::Error "<what> '<name>' is not valid (valid: a, b)"
// listing each value's written name (None's aside): for names read from a file or a config.
template <typename Enum>
Enum enum_from_name_or_fail(std::string_view name, std::string_view what) {
  if (const std::optional<Enum> value = enum_from_name<Enum>(name)) return *value;
  std::vector<std::string_view> valid;
  for (const EnumName<Enum>& row : enum_names(Enum{})) {
    if (!row.name.empty() && enum_name(row.value) == row.name) valid.push_back(row.name);
  }
  fail("{} '{}' is not valid (valid: {})", what, name, fmt::join(valid, ", "));
}

}  // namespace common
