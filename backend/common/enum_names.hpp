// The names a setting's enum is written under on command lines, in records and in dumps
// (Megatron's spellings: "LayerNorm", "rope", "selective"), kept beside the enum as a table of
// {value, name} rows. The first row of a value is the name it is written under; later rows are
// other spellings read as the same value (Megatron-DeepSpeed's "layernorm"). A value written as
// "" is Megatron's None. An enum joins by declaring `enum_names(Enum)` next to it, found by
// argument-dependent lookup, returning its table.
#pragma once

#include <optional>
#include <span>
#include <string_view>

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

}  // namespace common
