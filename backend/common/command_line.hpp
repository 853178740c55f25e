// The command-line conventions every executable of the backend shares, on CLI11 (the one CLI
// parser): Megatron flags this project knows but refuses are registered hidden, so that using
// one is reported with its reason rather than as an unknown argument; unknown arguments are
// reported first, with a "did you mean" suggestion, before CLI11's own "--x is required";
// a flag written where a value belongs ("--num-layers --hidden-size 64") is named as such,
// where CLI11 would take the flag for the value and report the word after it as unknown; and
// every value is checked with the shared table of flag rules (flag_rules.hpp) before CLI11
// converts it; and a long option may be abbreviated to any unique prefix, as argparse allows
// (expand_abbreviations). All end in common::Error naming the program and the flag.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/flag_rules.hpp"

namespace common {

struct RefusedFlag {
  const char* flag;
  bool takes_value;
  const char* reason;
};

class RefusedFlags {
 public:
  // Adds every flag to `app`, hidden from --help. Keep this object alive until after parsing:
  // the value options write into it.
  RefusedFlags(CLI::App& app, std::span<const RefusedFlag> flags);
  RefusedFlags(const RefusedFlags&) = delete;
  RefusedFlags& operator=(const RefusedFlags&) = delete;

  // After parsing: the first refused flag that was given stops with
  // "<program>: <flag> <wording>: <reason>".
  void refuse_given(const CLI::App& app, std::string_view program, std::string_view wording) const;

 private:
  std::span<const RefusedFlag> flags_;
  std::map<std::string, std::string> values_;
};

// Attaches its rule from `rules` (common/flag_rules: pretrain_gpt's flag_rules(), or a tool's
// own table) to every option of `app` that takes a value: each given value is checked before
// CLI11 converts it, and converted in the rule's reading ("010" is 10, as argparse's int(), not
// strtoll's octal 8). An option the table has no rule for is a programming error
// (std::logic_error): the table must cover the parser.
void apply_flag_rules(CLI::App& app, std::span<const FlagRule> rules);

// For an app parsed with allow_extras(): the first argument no option took stops with
// "<program>: unknown argument <arg> (did you mean ...?) (run <program> --help ...)".
void refuse_unknown_arguments(const CLI::App& app, std::string_view program);

// argparse's abbreviations (allow_abbrev, on in every Megatron parser): a long option may be
// written as any prefix of its name that no other option's name starts with ("--vocab" for
// --vocab-file when nothing else starts so), also as "--prefix=value". A word that is a name
// itself is never expanded, as argparse prefers the exact match; several names of one option
// matching (--seq-length and --encoder-seq-length) are that option. Names are every long name
// of `app`'s options, the hidden refused flags included, so an abbreviated refused flag is
// refused as the flag. An ambiguous prefix stops with argparse's message, "<program>:
// ambiguous option: --x could match --xa, --xb". Single-dash words and the words after "--"
// are kept as they are; words that no name starts with are left for the unknown-argument
// check. Returns argv, program name first, with the abbreviations written out; expanding the
// result again changes nothing.
std::vector<std::string> expand_abbreviations(const CLI::App& app, int argc,
                                              const char* const* argv, std::string_view program);

// Parses argv with `app` the way every tool does: abbreviations are written out first
// (expand_abbreviations); a value option followed by a flag instead of
// its value is reported first ("--num-layers needs a value, but the next argument is the flag
// --hidden-size"); unknown arguments are collected rather than fatal inside CLI11, so they
// are reported next (with a suggestion), then a refused flag
// with its reason, and only then CLI11's own errors ("--x is required"). Adds --version (the
// project's version, as `launcher --version` prints it). Returns false after printing --help
// or --version.
bool parse_command_line(CLI::App& app, int argc, const char* const* argv, std::string_view program,
                        const RefusedFlags& refused, std::string_view refused_wording);

}  // namespace common
