// See command_line.hpp.
#include "backend/common/command_line.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/common/suggest.hpp"

namespace common {

namespace {

bool takes_value(const CLI::Option& option) {
  return option.get_type_size_max() > 0 && option.get_items_expected_max() > 0;
}

// "--num-layers"; CLI11's get_name() is empty for the hidden (refused) options.
std::string long_name(const CLI::Option& option) {
  return option.get_lnames().empty() ? option.get_name() : "--" + option.get_lnames().front();
}

// argparse's test for a word that is an option rather than a value: it starts with '-', is
// more than "-", and is not a negative number.
bool looks_like_flag(const std::string& word) {
  if (word.size() < 2 || word.front() != '-') return false;
  const auto next = static_cast<unsigned char>(word[1]);
  return !(std::isdigit(next) || next == '.');
}

// CLI11 gives a value option the next word even when that word is a flag; the user left the
// value out, as argparse reports ("expected one argument"). Judged on the words as typed, not
// on what CLI11 stored: a value given with '=' ("--weight-decay=-inf", "--lr=-1e-4") is a
// value whatever it looks like, and its flag rule judges it.
void refuse_flag_taken_as_value(const CLI::App& app, int argc, const char* const* argv,
                                std::string_view program) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return;  // what follows is positional
    if (!looks_like_flag(word)) continue;
    const CLI::Option* option = app.get_option_no_throw(word);
    if (option == nullptr || !takes_value(*option)) continue;
    // The words CLI11 takes as its values whatever they look like (three for
    // --rampup-batch-size); a list option takes further words only up to the next flag.
    const int values = std::max(1, option->get_items_expected_min());
    for (int j = i + 1; j <= i + values && j < argc; ++j) {
      if (looks_like_flag(argv[j])) {
        fail("{}: {} needs a value, but the next argument is the flag {}", program,
             long_name(*option), argv[j]);
      }
    }
    i += values;
  }
}

}  // namespace

std::vector<std::string> expand_abbreviations(const CLI::App& app, int argc,
                                              const char* const* argv, std::string_view program) {
  struct Name {
    std::string text;  // "--vocab-file"
    const CLI::Option* option;
  };
  std::vector<Name> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back({"--" + name, option});
  }
  std::vector<std::string> words;
  bool positional = false;  // after "--"
  for (int i = 0; i < argc; ++i) {
    std::string word = argv[i];
    if (i == 0 || positional || !word.starts_with("--")) {
      words.push_back(std::move(word));
      continue;
    }
    if (word == "--") positional = true;
    const size_t equals = word.find('=');
    const std::string name = word.substr(0, equals);
    const auto is_name = [&name](const Name& known) { return known.text == name; };
    if (name.size() <= 2 || std::any_of(names.begin(), names.end(), is_name)) {
      words.push_back(std::move(word));
      continue;
    }
    std::vector<const Name*> matches;
    for (const Name& known : names) {
      if (known.text.starts_with(name)) matches.push_back(&known);
    }
    const bool one_option =
        !matches.empty() && std::all_of(matches.begin(), matches.end(), [&](const Name* match) {
          return match->option == matches.front()->option;
        });
    if (matches.empty()) {
      words.push_back(std::move(word));  // unknown: refuse_unknown_arguments names it
    } else if (one_option) {
      words.push_back(matches.front()->text +
                      (equals == std::string::npos ? "" : word.substr(equals)));
    } else {
      std::vector<std::string> candidates;
      for (const Name* match : matches) candidates.push_back(match->text);
      fail("{}: ambiguous option: {} could match {}", program, name,
           fmt::join(candidates, ", "));
    }
  }
  return words;
}

void apply_flag_rules(CLI::App& app, std::span<const FlagRule> rules) {
  for (CLI::Option* option : app.get_options()) {
    // Hidden options are the refused flags (RefusedFlags): refused whatever their value.
    if (!takes_value(*option) || option->get_group().empty()) continue;
    const std::string name = long_name(*option);
    const FlagRule* rule = find_flag_rule(rules, name);
    if (rule == nullptr) throw std::logic_error(name + " has no value rule in its tool's table");
    option->transform(CLI::Validator(
        [rule](std::string& value) {
          CheckedFlagValue checked = check_flag_value(*rule, value);
          if (checked.problem.empty()) value = std::move(checked.canonical);
          return checked.problem;
        },
        "", "flag rule"));
  }
}

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

bool parse_command_line(CLI::App& app, int original_argc, const char* const* original_argv,
                        std::string_view program, const RefusedFlags& refused,
                        std::string_view refused_wording) {
  // Every tool's --version prints what the launcher's does: the project's version.
  app.set_version_flag("--version", std::string(PROJECT_VERSION_STRING),
                       "Print the version (the launcher's) and exit");
  const std::vector<std::string> words =
      expand_abbreviations(app, original_argc, original_argv, program);
  std::vector<const char*> expanded;
  for (const std::string& word : words) expanded.push_back(word.c_str());
  const int argc = static_cast<int>(expanded.size());
  const char* const* argv = expanded.data();
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::CallForVersion&) {
    std::cout << PROJECT_VERSION_STRING << '\n';
    return false;
  } catch (const CLI::ParseError& error) {
    refuse_flag_taken_as_value(app, argc, argv, program);
    refuse_unknown_arguments(app, program);
    refused.refuse_given(app, program, refused_wording);
    fail("{}: {} (run {} --help for the supported flags)", program, error.what(), program);
  }
  refuse_flag_taken_as_value(app, argc, argv, program);
  refuse_unknown_arguments(app, program);
  refused.refuse_given(app, program, refused_wording);
  return true;
}

}  // namespace common
