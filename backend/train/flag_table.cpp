// The agreement of an enum flag's rule with its enum, and the dump's Python text of a value;
// see flag_table.hpp.
#include "backend/train/flag_table.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "backend/common/flag_rules.hpp"

namespace backend {

void check_enum_choices(std::string_view names, std::vector<std::string_view> enum_names) {
  const std::string_view flag = names.substr(0, names.find(','));
  const common::FlagRule* rule = common::find_flag_rule(flag);
  if (rule == nullptr) return;
  std::vector<std::string_view> choices(rule->choices.begin(), rule->choices.end());
  std::vector<std::string_view> sorted_names = enum_names;
  std::sort(choices.begin(), choices.end());
  std::sort(sorted_names.begin(), sorted_names.end());
  if (rule->kind == common::FlagKind::choice && choices == sorted_names) return;
  throw std::logic_error(fmt::format(
      "{}: its rule in common/flag_rules.cpp takes {} but its enum's names are {}", flag,
      rule->kind == common::FlagKind::choice ? fmt::format("{}", fmt::join(rule->choices, ", "))
                                             : std::string("no list of choices"),
      fmt::join(enum_names, ", ")));
}

std::string python_text(const nlohmann::json& value, FlagDump dump) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "None";
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case nlohmann::json::value_t::string:
      return value.get<std::string>();
    case nlohmann::json::value_t::array: {
      std::vector<std::string> quoted;
      for (const auto& word : value) quoted.push_back(fmt::format("'{}'", python_text(word)));
      return fmt::format("[{}]", fmt::join(quoted, ", "));
    }
    case nlohmann::json::value_t::number_integer:
      return fmt::format("{}", value.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return fmt::format("{}", value.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return dump == FlagDump::python_float ? common::format_python_float(value.get<double>())
                                            : fmt::format("{}", value.get<double>());
    default:
      return value.dump();
  }
}

}  // namespace backend
