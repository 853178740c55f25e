// The agreement of an enum flag's rule with its enum; see flag_table.hpp.
#include "backend/train/flag_table.hpp"

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

}  // namespace backend
