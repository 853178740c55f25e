// A struct's enum field as a value that sets it from a name and gives its name back, for the
// tables that walk a config struct's fields by member pointer: the flag tables
// (train/flag_table.hpp: command line and arguments dump) and a checkpoint's record of its
// arguments (ckpt/checkpoint_record.hpp). The names are the enum's table (enum_names.hpp).
#pragma once

#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/common/enum_names.hpp"

namespace common {

// A field holding an enum (or an optional one) whose names are its values on the command line,
// in the dump and in the record; made by enum_flag_field<&Config::field>().
template <typename Config>
struct EnumFlagField {
  bool (*set)(Config& config, std::string_view name);  // false: not one of the enum's names
  std::string_view (*name)(const Config& config);      // "" for Megatron's None
  std::vector<std::string_view> (*names)();  // every name it reads (None's aside), in order
};

template <typename Member>
struct MemberPointerTraits;
template <typename Owner, typename Field>
struct MemberPointerTraits<Field Owner::*> {
  using Config = Owner;
  using Value = Field;
};
template <typename Value>
struct OptionalValue {
  using Type = Value;
};
template <typename Value>
struct OptionalValue<std::optional<Value>> {
  using Type = Value;
};

template <auto member>
constexpr auto enum_flag_field() {
  using Config = typename MemberPointerTraits<decltype(member)>::Config;
  using Value = typename MemberPointerTraits<decltype(member)>::Value;
  using Enum = typename OptionalValue<Value>::Type;
  return EnumFlagField<Config>{[](Config& config, std::string_view name) {
                                 const std::optional<Enum> value = enum_from_name<Enum>(name);
                                 if (value) config.*member = *value;
                                 return value.has_value();
                               },
                               [](const Config& config) -> std::string_view {
                                 if constexpr (std::is_same_v<Value, Enum>) {
                                   return enum_name(config.*member);
                                 } else {
                                   return config.*member ? enum_name(*(config.*member))
                                                         : std::string_view();
                                 }
                               },
                               [] {
                                 std::vector<std::string_view> names;
                                 for (const EnumName<Enum>& row : enum_names(Enum{})) {
                                   if (!row.name.empty()) names.push_back(row.name);
                                 }
                                 return names;
                               }};
}

}  // namespace common
