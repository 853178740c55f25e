// One concern's flags as a table, as Megatron core generates its argument groups from its config
// dataclasses: a row names the flag (with its other spellings), the field of the concern's
// struct it sets, its help, and the name Megatron's arguments dump prints it under. The CLI11
// registration (and so --help and docs/backend.md's check of it) and the dump's lines are made
// from the rows, so a flag is written down once. Its value rule (kind, range, choices) is the
// shared table's, common/flag_rules.cpp, which parse_arguments applies to every option by name.
//
// The dump prints a value as Python's str() of Megatron's: True/False, numbers as fmt prints
// them (or, where the row says so, as Python prints a float), strings as they are; an empty
// list or optional, and where the row says so an empty string or a number ≤ 0, as None; a list
// as ['a', 'b'] (argparse keeps nargs flags as strings, numbers included); an enum as its name
// (common/enum_names.hpp).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "backend/common/enum_flag_field.hpp"
#include "backend/common/enum_names.hpp"
#include "backend/common/python_format.hpp"

namespace backend {

// How the dump prints a row's value beyond its type's way (above).
enum class FlagDump { value, none_if_empty, none_if_not_positive, python_float };

// Whether the flag must be given: `shape` flags are required unless the checkpoint gives the
// model's shape (--use-checkpoint-args), which the caller decides: add_flag_rows hands them over.
enum class FlagRequirement { optional, required, shape };

// An enum row's field (common/enum_flag_field.hpp), named here as the tables name it.
using common::enum_flag_field;
using common::EnumFlagField;

template <typename Config>
using FlagField =
    std::variant<bool Config::*, int64_t Config::*, uint64_t Config::*, double Config::*,
                 std::string Config::*, std::optional<int64_t> Config::*,
                 std::optional<double> Config::*, std::vector<std::string> Config::*,
                 std::vector<int64_t> Config::*, EnumFlagField<Config>>;

template <typename Config>
struct FlagRow {
  const char* names;  // "--flag" or "--flag,--other-spelling", as CLI11 takes them
  FlagField<Config> field;
  const char* help;
  const char* dump_name = nullptr;  // Megatron's dest; nullptr: not in the dump
  FlagDump dump = FlagDump::value;
  FlagRequirement requirement = FlagRequirement::optional;
  const char* default_text = nullptr;  // --help's default where CLI11's would mislead
  int words = 0;  // a list of numbers: exactly this many words (the last given is kept)
};

// An enum flag's choices in the shared rule table (common/flag_rules.cpp, which the launcher
// reads without the enums) are its enum's names: a rule that lists others is a bug in this
// program, refused when the option is made, so that no test that parses flags passes with it.
// A std::logic_error (an internal error) names the flag and both lists. A flag without a rule
// (a test's) is not checked.
void check_enum_choices(std::string_view names, std::vector<std::string_view> enum_names);

// An enum row's option: one word, as a string option takes it (its value rule has checked
// it before the callback sees it).
template <typename Config>
CLI::Option* add_enum_option(CLI::App& app, Config& config, const FlagRow<Config>& row,
                             EnumFlagField<Config> field) {
  check_enum_choices(row.names, field.names());
  CLI::Option* option = app.add_option(
      row.names,
      [&config, field](const CLI::results_t& results) {
        return results.size() == 1 && field.set(config, results.front());
      },
      row.help, false, [&config, field] { return std::string(field.name(config)); });
  option->type_name(CLI::detail::type_name<std::string>());
  option->type_size(1, 1);
  option->expected(1);
  option->run_callback_for_default();
  // A required flag has no default to show: its field's initial value is a placeholder.
  if (row.requirement == FlagRequirement::required) option->default_str("");
  return option;
}

// Registers each row on `app` in `group`: a bool field is a switch, a list of strings takes one
// or more words (all of them kept), a list of numbers `words` words, anything else one value.
// The options of `shape` rows are appended to `shape_options`.
template <typename Config>
void add_flag_rows(CLI::App& app, Config& config, std::span<const FlagRow<Config>> rows,
                   const std::string& group, std::vector<CLI::Option*>* shape_options = nullptr) {
  for (const FlagRow<Config>& row : rows) {
    CLI::Option* option = std::visit(
        [&](auto member) -> CLI::Option* {
          if constexpr (std::is_same_v<decltype(member), EnumFlagField<Config>>) {
            return add_enum_option(app, config, row, member);
          } else {
            auto& target = config.*member;
            using Field = std::remove_reference_t<decltype(target)>;
            if constexpr (std::is_same_v<Field, bool>) {
              return app.add_flag(row.names, target, row.help);
            } else if constexpr (std::is_same_v<Field, std::vector<std::string>>) {
              return app.add_option(row.names, target, row.help)
                  ->expected(1, -1)
                  ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
            } else if constexpr (std::is_same_v<Field, std::vector<int64_t>>) {
              return app.add_option(row.names, target, row.help)
                  ->expected(row.words)
                  ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
            } else {
              return app.add_option(row.names, target, row.help);
            }
          }
        },
        row.field);
    option->group(group);
    if (row.default_text != nullptr) option->default_str(row.default_text);
    if (row.requirement == FlagRequirement::required) option->required();
    if (row.requirement == FlagRequirement::shape && shape_options != nullptr) {
      shape_options->push_back(option);
    }
  }
}

// A row's value as Megatron's args hold it: null for None, a bool, a number, a string (an
// enum's name), or a list of strings (argparse keeps nargs flags as strings, numbers included).
template <typename Config>
nlohmann::json flag_row_value(const Config& config, const FlagRow<Config>& row) {
  return std::visit(
      [&](auto member) -> nlohmann::json {
        if constexpr (std::is_same_v<decltype(member), EnumFlagField<Config>>) {
          const std::string_view name = member.name(config);
          if (row.dump == FlagDump::none_if_empty && name.empty()) return nullptr;
          return std::string(name);
        } else {
          const auto& value = config.*member;
          using Field = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<Field, bool>) {
            return value;
          } else if constexpr (std::is_same_v<Field, std::vector<std::string>> ||
                               std::is_same_v<Field, std::vector<int64_t>>) {
            if (value.empty()) return nullptr;
            nlohmann::json words = nlohmann::json::array();
            for (const auto& word : value) words.push_back(fmt::format("{}", word));
            return words;
          } else if constexpr (std::is_same_v<Field, std::string>) {
            if (row.dump == FlagDump::none_if_empty && value.empty()) return nullptr;
            return value;
          } else if constexpr (std::is_same_v<Field, std::optional<int64_t>> ||
                               std::is_same_v<Field, std::optional<double>>) {
            if (!value) return nullptr;
            return *value;
          } else {
            if (row.dump == FlagDump::none_if_not_positive && value <= 0) return nullptr;
            return value;
          }
        }
      },
      row.field);
}

// Python's str() of a value as flag_row_value gives it, as Megatron's dump prints it: a float
// as fmt prints it, or as Python does where `dump` says so.
std::string python_text(const nlohmann::json& value, FlagDump dump = FlagDump::value);

// The dumped rows' values by their dump names, into `values`: as the dump prints them, or
// (a JSON object) as Megatron's args hold them.
template <typename Config>
void dump_flag_rows(const Config& config, std::span<const FlagRow<Config>> rows,
                    std::map<std::string, std::string>& values) {
  for (const FlagRow<Config>& row : rows) {
    if (row.dump_name != nullptr) {
      values[row.dump_name] = python_text(flag_row_value(config, row), row.dump);
    }
  }
}
template <typename Config>
void dump_flag_rows(const Config& config, std::span<const FlagRow<Config>> rows,
                    nlohmann::json& values) {
  for (const FlagRow<Config>& row : rows) {
    if (row.dump_name != nullptr) values[row.dump_name] = flag_row_value(config, row);
  }
}

}  // namespace backend
