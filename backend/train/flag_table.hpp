// One concern's flags as a table, as Megatron core generates its argument groups from its config
// dataclasses: a row names the flag (with its other spellings), the field of the concern's
// struct it sets, its help, and the name Megatron's arguments dump prints it under. The CLI11
// registration (and so --help and docs/backend.md's check of it) and the dump's lines are made
// from the rows, so a flag is written down once. Its value rule (kind, range, choices) is the
// shared table's, common/flag_rules.cpp, which parse_arguments applies to every option by name.
//
// The dump prints a value as Python's str() of Megatron's: True/False, numbers as fmt prints
// them, strings as they are; an empty list, and where the row says so an empty string or a
// number ≤ 0, as None; a list as ['a', 'b'] (argparse keeps nargs flags as strings).
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace backend {

// How the dump prints a row's value beyond its type's way (above).
enum class FlagDump { value, none_if_empty, none_if_not_positive };

template <typename Config>
using FlagField = std::variant<bool Config::*, int64_t Config::*, double Config::*,
                               std::string Config::*, std::vector<std::string> Config::*>;

template <typename Config>
struct FlagRow {
  const char* names;  // "--flag" or "--flag,--other-spelling", as CLI11 takes them
  FlagField<Config> field;
  const char* help;
  const char* dump_name = nullptr;  // Megatron's dest; nullptr: not in the dump
  FlagDump dump = FlagDump::value;
  bool required = false;
};

// Registers each row on `app` in `group`: a bool field is a switch, a list takes one or more
// words (all of them kept), anything else one value.
template <typename Config>
void add_flag_rows(CLI::App& app, Config& config, std::span<const FlagRow<Config>> rows,
                   const std::string& group) {
  for (const FlagRow<Config>& row : rows) {
    CLI::Option* option = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& target = config.*member;
          using Field = std::remove_reference_t<decltype(target)>;
          if constexpr (std::is_same_v<Field, bool>) {
            return app.add_flag(row.names, target, row.help);
          } else if constexpr (std::is_same_v<Field, std::vector<std::string>>) {
            return app.add_option(row.names, target, row.help)
                ->expected(1, -1)
                ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
          } else {
            return app.add_option(row.names, target, row.help);
          }
        },
        row.field);
    option->group(group);
    if (row.required) option->required();
  }
}

// The dumped rows' values by their dump names, into `values`.
template <typename Config>
void dump_flag_rows(const Config& config, std::span<const FlagRow<Config>> rows,
                    std::map<std::string, std::string>& values) {
  for (const FlagRow<Config>& row : rows) {
    if (row.dump_name == nullptr) continue;
    values[row.dump_name] = std::visit(
        [&](auto member) -> std::string {
          const auto& value = config.*member;
          using Field = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<Field, bool>) {
            return value ? "True" : "False";
          } else if constexpr (std::is_same_v<Field, std::vector<std::string>>) {
            if (value.empty()) return "None";
            std::vector<std::string> quoted;
            for (const std::string& word : value) quoted.push_back(fmt::format("'{}'", word));
            return fmt::format("[{}]", fmt::join(quoted, ", "));
          } else if constexpr (std::is_same_v<Field, std::string>) {
            return row.dump == FlagDump::none_if_empty && value.empty() ? "None" : value;
          } else {
            return row.dump == FlagDump::none_if_not_positive && value <= 0
                       ? "None"
                       : fmt::format("{}", value);
          }
        },
        row.field);
  }
}

}  // namespace backend
