// See command_line.hpp.
#include "backend/common/command_line.hpp"

#include <iostream>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/suggest.hpp"

namespace common {

RefusedFlags::RefusedFlags(CLI::App& app, std::span<const RefusedFlag> flags) : flags_(flags) {
  for (const RefusedFlag& entry : flags_) {
    if (entry.takes_value) {
      app.add_option(entry.flag, values_[entry.flag])->group("");
    } else {
      app.add_flag(entry.flag)->group("");
    }
  }
}

void RefusedFlags::refuse_given(const CLI::App& app, std::string_view program,
                                std::string_view wording) const {
  for (const RefusedFlag& entry : flags_) {
    if (app.count(entry.flag) > 0) fail("{}: {} {}: {}", program, entry.flag, wording, entry.reason);
  }
}

void refuse_unknown_arguments(const CLI::App& app, std::string_view program) {
  const std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return;
  std::vector<std::string> known;
  for (const CLI::Option* option : app.get_options()) {
    for (const auto& name : option->get_lnames()) known.push_back("--" + name);
  }
  const std::string& first = extras.front();
  fail("{}: unknown argument {}{} (run {} --help for the supported flags)", program, first,
       did_you_mean(first, known), program);
}

bool parse_command_line(CLI::App& app, int argc, const char* const* argv, std::string_view program,
                        const RefusedFlags& refused, std::string_view refused_wording) {
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::ParseError& error) {
    refuse_unknown_arguments(app, program);
    refused.refuse_given(app, program, refused_wording);
    fail("{}: {} (run {} --help for the supported flags)", program, error.what(), program);
  }
  refuse_unknown_arguments(app, program);
  refused.refuse_given(app, program, refused_wording);
  return true;
}

}  // namespace common
