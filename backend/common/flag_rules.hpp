// The one table of value rules for the Megatron-LM flags pretrain_gpt takes: for each flag its
// kind (integer, real, choice, text, or the --split share list), its range with inclusivity,
// and its valid choices. Two readers apply the same table to the same text:
//   - pretrain_gpt's parser (backend/train/arguments.cpp, through common::apply_flag_rules)
//     checks every given value before CLI11 converts it;
//   - the launcher's training stage (launcher/stages/training_stage.cpp) checks every config
//     value it maps to a flag before anything is queued, naming the config key.
// So a value is refused with the same words in both places, each naming what its user wrote:
//   "'abc' is not a number; --lr takes a real number ≥ 0",
//   "'abc' is not a number; training.model.optim.lr (--lr) takes a real number ≥ 0".
// The ranges are Megatron's (megatron/training/arguments.py and the asserts of validate_args,
// the optimizer and the scheduler): sizes and counts positive, probabilities in [0, 1), every
// real finite. A default is "not given", never "0 given": --global-batch-size 0 is refused, not
// taken for the default. Rules between flags (--min-lr ≤ --lr, --seq-length ≤
// --max-position-embeddings, ...) and features this backend has not built yet (--tokenizer-type
// Llama2Tokenizer, --tensor-model-parallel-size 2) are not value rules: the backend's
// validation checks those, so the launcher still renders configs that need them.
//
// Grammar of the text: integers are decimal with an optional sign (Python's int(): "010" is
// 10, "1e3" is not an integer); reals are decimal or scientific (strtod without hexadecimal,
// inf or nan); a --split is one to three shares separated by ',' or '/', spaces allowed.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace common {

enum class FlagKind { integer, real, choice, text, split };

struct FlagRule {
  std::string_view flag;   // Megatron's name, e.g. "--lr"
  std::string_view alias;  // a second name of the same flag ("--layernorm-epsilon"), or ""
  FlagKind kind = FlagKind::text;
  // integer: the inclusive range.
  int64_t min_integer = std::numeric_limits<int64_t>::min();
  int64_t max_integer = std::numeric_limits<int64_t>::max();
  // real: always finite, and within these bounds (±infinity: unbounded on that side).
  double lower = -std::numeric_limits<double>::infinity();
  double upper = std::numeric_limits<double>::infinity();
  bool lower_inclusive = true;
  bool upper_inclusive = true;
  std::span<const std::string_view> choices;  // choice
  std::string_view note;  // why the range is what it is, said after the description
};

// Builders for rule tables: pretrain_gpt's (flag_rules()) and the other tools' own
// (preprocess_data, download), which common::apply_flag_rules attaches to a parser the same way.
constexpr FlagRule integer_flag(std::string_view flag, int64_t min,
                                int64_t max = std::numeric_limits<int64_t>::max(),
                                std::string_view note = {}) {
  FlagRule rule;
  rule.flag = flag;
  rule.kind = FlagKind::integer;
  rule.min_integer = min;
  rule.max_integer = max;
  rule.note = note;
  return rule;
}
// A finite real number in a range; `lower_inclusive`/`upper_inclusive` say whether the bounds are.
constexpr FlagRule real_flag(std::string_view flag, double lower, bool lower_inclusive,
                             double upper = std::numeric_limits<double>::infinity(),
                             bool upper_inclusive = true) {
  FlagRule rule;
  rule.flag = flag;
  rule.kind = FlagKind::real;
  rule.lower = lower;
  rule.lower_inclusive = lower_inclusive;
  rule.upper = upper;
  rule.upper_inclusive = upper_inclusive;
  return rule;
}
constexpr FlagRule probability_flag(std::string_view flag) { return real_flag(flag, 0, true, 1, false); }
constexpr FlagRule choice_flag(std::string_view flag, std::span<const std::string_view> choices) {
  FlagRule rule;
  rule.flag = flag;
  rule.kind = FlagKind::choice;
  rule.choices = choices;
  return rule;
}
// Any text (a path, a URL): the rule only records that the flag is known.
constexpr FlagRule text_flag(std::string_view flag, std::string_view alias = {}) {
  FlagRule rule;
  rule.flag = flag;
  rule.alias = alias;
  rule.kind = FlagKind::text;
  return rule;
}

// pretrain_gpt's rules, in the order of docs/backend.md's flag table.
std::span<const FlagRule> flag_rules();

// The rule of `flag` (its name or its alias) in pretrain_gpt's table, or in `rules`; nullptr
// when the table has none.
const FlagRule* find_flag_rule(std::string_view flag);
const FlagRule* find_flag_rule(std::span<const FlagRule> rules, std::string_view flag);

// "--lr takes a real number ≥ 0", "--seed takes an integer in [1, 4294967295] (...)". With a
// `subject`, it is named instead of the flag: the launcher checks a config key with the rule of
// the flag it renders, and says "training.model.optim.lr (--lr) takes a real number ≥ 0".
std::string describe_flag_rule(const FlagRule& rule, std::string_view subject = {});

struct CheckedFlagValue {
  // Empty when the value is valid; else what is wrong and what is valid:
  // "'abc' is not a number; --lr takes a real number ≥ 0".
  std::string problem;
  // A valid value as the backend reads it: integers in plain decimal ("010" → "10"), reals in
  // their shortest round-trip form, anything else as given.
  std::string canonical;
};
CheckedFlagValue check_flag_value(const FlagRule& rule, std::string_view value,
                                  std::string_view subject = {});

// --split's shares as given (not normalised), padded with zeros to three; a text that is not
// one to three non-negative finite numbers, not all 0, is a common::Error
// "--split '<text>': <what is wrong>; --split takes ...". Megatron finds the numbers with
// re.findall(r"[.0-9]+"), which reads "-1,2,3" as 1,2,3 and "nan,1,1" as 1,1 (a test split of
// nothing); those are refused here instead.
std::array<double, 3> parse_split_shares(std::string_view text);

}  // namespace common
