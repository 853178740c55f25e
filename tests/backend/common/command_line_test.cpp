// The shared command-line conventions: a refused Megatron flag is named with its reason even
// when a required flag is missing too (the refusal is what the user must act on first), and
// an unknown argument gets a suggestion.
#include "backend/common/command_line.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backend/common/error.hpp"

namespace {

constexpr common::RefusedFlag kRefused[] = {
    {"--sequence-parallel", false, "needs tensor parallelism"},
    {"--tokenizer-model", true, "SentencePiece is not built"},
};

// Parses `words` as a tool with a required --num-layers, as pretrain_gpt and preprocess_data do.
void parse_tool(std::vector<std::string> words) {
  CLI::App app{"test", "tool"};
  int layers = 0;
  app.add_option("--num-layers", layers)->required();
  const common::RefusedFlags refused(app, kRefused);
  words.insert(words.begin(), "tool");
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  common::parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "tool", refused,
                             "is refused");
}

}  // namespace

TEST_CASE("a refused flag is named with its reason, before a missing required flag") {
  CHECK_THROWS_WITH_AS(parse_tool({"--sequence-parallel"}),
                       "tool: --sequence-parallel is refused: needs tensor parallelism",
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers", "2", "--tokenizer-model", "x.model"}),
                       "tool: --tokenizer-model is refused: SentencePiece is not built",
                       common::Error);
  CHECK_NOTHROW(parse_tool({"--num-layers", "2"}));
  CHECK_THROWS_WITH_AS(parse_tool({}), doctest::Contains("--num-layers is required"), common::Error);
}

TEST_CASE("an unknown argument is named first, with a suggestion") {
  // (--num-layer would be an abbreviation of --num-layers, below.)
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layrs", "2"}),
                       doctest::Contains("tool: unknown argument --num-layrs Did you mean '--num-layers'?"),
                       common::Error);
}

TEST_CASE("a long option may be abbreviated to a unique prefix, as argparse allows") {
  CLI::App app{"test", "tool"};
  int layers = 0, layers_per_stage = 0, hidden = 0, seq = 0;
  std::string vocab;
  app.add_option("--num-layers", layers);
  app.add_option("--num-layers-per-stage", layers_per_stage);
  app.add_option("--hidden-size", hidden);
  app.add_option("--seq-length,--encoder-seq-length", seq);
  app.add_option("--vocab-file", vocab);
  const common::RefusedFlags refused(app, kRefused);
  const auto parse = [&](std::vector<std::string> words) {
    words.insert(words.begin(), "tool");
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    app.clear();
    common::parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "tool", refused,
                               "is refused");
  };
  const auto expand = [&](std::vector<std::string> words) {
    words.insert(words.begin(), "tool");
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    auto expanded = common::expand_abbreviations(app, static_cast<int>(argv.size()), argv.data(), "tool");
    expanded.erase(expanded.begin());
    return expanded;
  };

  parse({"--hidden", "64", "--voc=v.json", "--num-layers", "2", "--num-layers-p", "3"});
  CHECK(hidden == 64);
  CHECK(vocab == "v.json");
  CHECK(layers == 2);  // an exact name wins over the longer names it is a prefix of
  CHECK(layers_per_stage == 3);
  // Two names of one option are that option; the value after '=' is kept whole.
  CHECK(expand({"--enc=--x", "--seq-", "5"}) ==
        std::vector<std::string>{"--encoder-seq-length=--x", "--seq-length", "5"});
  // Single-dash words, values and everything after "--" are kept as they are.
  CHECK(expand({"-h", "--hidden", "-1", "--", "--hid"}) ==
        std::vector<std::string>{"-h", "--hidden-size", "-1", "--", "--hid"});
  // Expanding the result again changes nothing.
  CHECK(expand(expand({"--hid", "1", "--num-layers", "2"})) ==
        std::vector<std::string>{"--hidden-size", "1", "--num-layers", "2"});

  CHECK_THROWS_WITH_AS(parse({"--num", "2"}),
                       "tool: ambiguous option: --num could match --num-layers, --num-layers-per-stage",
                       common::Error);
  CHECK_THROWS_WITH_AS(parse({"--num-layers", "2", "--s=3"}),
                       "tool: ambiguous option: --s could match --seq-length, --sequence-parallel",
                       common::Error);
  // A prefix of a refused flag is that flag, refused with its reason.
  CHECK_THROWS_WITH_AS(parse({"--num-layers", "2", "--tok", "m"}),
                       "tool: --tokenizer-model is refused: SentencePiece is not built",
                       common::Error);
  CHECK_THROWS_WITH_AS(parse({"--num-layers", "2", "--hidden-sizes", "2"}),
                       doctest::Contains("unknown argument --hidden-sizes"), common::Error);
}

TEST_CASE("a flag written where a value belongs is named, not the value left over") {
  // CLI11 gives --num-layers the next word even when it is a flag; argparse says "expected one
  // argument". The word after it (2) must not be reported as an unknown argument instead.
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers", "--sequence-parallel", "2"}),
                       "tool: --num-layers needs a value, but the next argument is the flag "
                       "--sequence-parallel",
                       common::Error);
  CHECK_THROWS_WITH_AS(parse_tool({"--tokenizer-model", "--num-layers", "2"}),
                       doctest::Contains("--tokenizer-model needs a value, but the next argument is "
                                         "the flag --num-layers"),
                       common::Error);
  // A negative number is a value, as in argparse.
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers", "-2", "--sequence-parallel"}),
                       doctest::Contains("--sequence-parallel is refused"), common::Error);
  // A value given with '=' is a value, whatever it looks like: judged as one, never as a flag.
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers=-x"}),
                       doctest::Contains("Could not convert: --num-layers = -x"), common::Error);
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers", "2", "--tokenizer-model=-m"}),
                       "tool: --tokenizer-model is refused: SentencePiece is not built",
                       common::Error);
  // A flag's name given as another's value with '=' is that value, not a flag.
  CHECK_THROWS_WITH_AS(parse_tool({"--num-layers", "2", "--tokenizer-model=--num-layers"}),
                       "tool: --tokenizer-model is refused: SentencePiece is not built",
                       common::Error);
}
