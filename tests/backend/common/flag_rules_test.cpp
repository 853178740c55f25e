// The shared table of flag value rules: each kind's grammar and range, the words of a refusal,
// and the --split share list; and that pretrain_gpt's parser applies it to every value flag.
#include "backend/common/flag_rules.hpp"

#include <doctest/doctest.h>

#include <string>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"

using common::check_flag_value;
using common::find_flag_rule;

namespace {
std::string problem(const std::string& flag, const std::string& value) {
  const common::FlagRule* rule = find_flag_rule(flag);
  REQUIRE(rule != nullptr);
  return check_flag_value(*rule, value).problem;
}
std::string canonical(const std::string& flag, const std::string& value) {
  const auto checked = check_flag_value(*find_flag_rule(flag), value);
  REQUIRE(checked.problem.empty());
  return checked.canonical;
}
}  // namespace

TEST_CASE("a refused value says what is wrong and what the flag takes") {
  CHECK(problem("--lr", "abc") == "'abc' is not a number; --lr takes a real number ≥ 0");
  CHECK(problem("--global-batch-size", "-4") ==
        "'-4' is out of range; --global-batch-size takes an integer ≥ 1");
  CHECK(problem("--hidden-dropout", "2") ==
        "'2' is out of range; --hidden-dropout takes a real number in [0, 1)");
  CHECK(problem("--lr-decay-style", "exponential") ==
        "'exponential' is not a valid choice; --lr-decay-style takes one of constant, linear, "
        "cosine, inverse-square-root, WSD");
  CHECK(problem("--seed", "-1").starts_with("'-1' is out of range; --seed takes an integer in "
                                            "[1, 4294967295] (Megatron requires a positive seed"));
}

TEST_CASE("reals are finite: inf, nan and overflows are refused for every real flag") {
  for (const auto& rule : common::flag_rules()) {
    if (rule.kind != common::FlagKind::real) continue;
    CAPTURE(rule.flag);
    for (const char* value : {"inf", "-inf", "nan", "NaN", "1e999", "infinity"}) {
      CAPTURE(value);
      CHECK(check_flag_value(rule, value).problem.find("is not a finite number") != std::string::npos);
    }
    CHECK(check_flag_value(rule, "0x1p-3").problem.find("is not a number") != std::string::npos);
  }
  CHECK(canonical("--lr", "6e-4") == "0.0006");
  CHECK(canonical("--lr", " 1.5 ") == "1.5");
  CHECK(problem("--adam-eps", "0").find("takes a real number > 0") != std::string::npos);
  CHECK(problem("--rotary-percent", "0").find("in (0, 1]") != std::string::npos);
  CHECK(problem("--rotary-percent", "1").empty());
}

TEST_CASE("integers are decimal and within int64 and the flag's range — 0 is not a default") {
  CHECK(canonical("--num-layers", "010") == "10");  // Python's int(), not C's octal
  CHECK(canonical("--num-layers", "+7") == "7");
  CHECK(problem("--num-layers", "0x10").starts_with("'0x10' is not an integer"));
  CHECK(problem("--num-layers", "1e3").starts_with("'1e3' is not an integer"));
  CHECK(problem("--num-layers", "2.0").starts_with("'2.0' is not an integer"));
  CHECK(problem("--num-layers", "").starts_with("'' is not an integer"));
  CHECK(problem("--num-layers", "99999999999999999999") ==
        "'99999999999999999999' is larger than any integer this backend counts in; --num-layers "
        "takes an integer ≥ 1");
  CHECK(problem("--num-layers", "9223372036854775808").find("is larger than") != std::string::npos);
  CHECK(canonical("--num-layers", "9223372036854775807") == "9223372036854775807");
  CHECK(problem("--eval-iters", "-9223372036854775809").find("is smaller than") != std::string::npos);
  for (const char* flag : {"--max-position-embeddings", "--global-batch-size", "--ffn-hidden-size",
                           "--train-iters", "--lr-decay-iters", "--vocab-size", "--save-interval"}) {
    CAPTURE(flag);
    CHECK(problem(flag, "0").starts_with("'0' is out of range"));
  }
  CHECK(problem("--seed", "4294967296").starts_with("'4294967296' is out of range"));
  CHECK(problem("--seed", "99999999999999999999").find("is larger than") != std::string::npos);
  CHECK(canonical("--seed", "4294967295") == "4294967295");
  CHECK(problem("--vocab-size", "2147483647").starts_with("'2147483647' is out of range"));
}

TEST_CASE("--split: one to three non-negative finite shares, refused where Megatron misreads") {
  CHECK(common::parse_split_shares("949,50,1") == std::array<double, 3>{949, 50, 1});
  CHECK(common::parse_split_shares("969, 30, 1") == std::array<double, 3>{969, 30, 1});
  CHECK(common::parse_split_shares("99990/8/2") == std::array<double, 3>{99990, 8, 2});
  CHECK(common::parse_split_shares("1") == std::array<double, 3>{1, 0, 0});
  CHECK(common::parse_split_shares("0.7,0.2") == std::array<double, 3>{0.7, 0.2, 0});
  CHECK_THROWS_WITH_AS(common::parse_split_shares("-1,2,3"),
                       doctest::Contains("--split '-1,2,3': '-1' is negative; --split takes one to "
                                         "three non-negative shares"),
                       common::Error);
  CHECK_THROWS_WITH_AS(common::parse_split_shares("nan,1,1"),
                       doctest::Contains("'nan' is not a finite number"), common::Error);
  CHECK_THROWS_WITH_AS(common::parse_split_shares("1,2,3,4"), doctest::Contains("4 shares"),
                       common::Error);
  CHECK_THROWS_WITH_AS(common::parse_split_shares("0,0,0"), doctest::Contains("sum to 0"),
                       common::Error);
  CHECK_THROWS_WITH_AS(common::parse_split_shares("99,x,1"),
                       doctest::Contains("'x' is not a number"), common::Error);
  CHECK_THROWS_WITH_AS(common::parse_split_shares("1,,1"), doctest::Contains("'' is not a number"),
                       common::Error);
  CHECK(problem("--split", "-1,2,3").starts_with("'-1,2,3': '-1' is negative; --split takes"));
}

TEST_CASE("aliases find their flag's rule — unknown flags have none") {
  CHECK(find_flag_rule("--layernorm-epsilon") == find_flag_rule("--norm-epsilon"));
  CHECK(find_flag_rule("--data-path-file") == find_flag_rule("--data-file-list"));
  CHECK(find_flag_rule("--no-such-flag") == nullptr);
  CHECK(find_flag_rule("") == nullptr);
}

TEST_CASE("apply_flag_rules checks each given value before CLI11 converts it") {
  CLI::App app{"test", "tool"};
  int64_t layers = 0;
  double lr = 0;
  app.add_option("--num-layers", layers);
  app.add_option("--lr", lr);
  app.add_flag("--mock-data");
  common::apply_flag_rules(app, common::flag_rules());
  app.parse("--num-layers 010 --mock-data", false);
  CHECK(layers == 10);  // the rule's reading, not strtoll's octal 8
  app.clear();
  CHECK_THROWS_WITH_AS(app.parse("--lr inf", false),
                       "--lr: 'inf' is not a finite number; --lr takes a real number ≥ 0",
                       CLI::ValidationError);
  app.clear();
  CHECK_THROWS_WITH_AS(app.parse("--num-layers 99999999999999999999", false),
                       doctest::Contains("is larger than any integer"), CLI::ValidationError);

  CLI::App without_rule{"test", "tool"};
  int64_t value = 0;
  without_rule.add_option("--not-a-megatron-flag", value);
  CHECK_THROWS_AS(common::apply_flag_rules(without_rule, common::flag_rules()), std::logic_error);
}

TEST_CASE("a tool's own rule table works as pretrain_gpt's") {
  static constexpr common::FlagRule kToolRules[] = {common::integer_flag("--retries", 0, 1000),
                                                    common::real_flag("--delay", 0, true, 60)};
  CLI::App app{"test", "tool"};
  int64_t retries = 0;
  double delay = 0;
  app.add_option("--retries", retries);
  app.add_option("--delay", delay);
  common::apply_flag_rules(app, kToolRules);
  app.parse("--retries 7 --delay 1.5", false);
  CHECK(retries == 7);
  CHECK(delay == 1.5);
  app.clear();
  CHECK_THROWS_WITH_AS(app.parse("--retries -1", false),
                       "--retries: '-1' is out of range; --retries takes an integer in [0, 1000]",
                       CLI::ValidationError);
  app.clear();
  CHECK_THROWS_WITH_AS(app.parse("--delay nan", false),
                       doctest::Contains("'nan' is not a finite number"), CLI::ValidationError);
  CHECK(common::find_flag_rule(kToolRules, "--lr") == nullptr);
}
