// The zero-shot tasks' parts, each against hand-computed expectations from Megatron-LM's
// tasks/zeroshot_gpt semantics: the WikiText detokenizer (every substitution, in its order),
// the word count, the overlapping windows and their masks (every target scored once), the
// LAMBADA targets (strict and not) and windows, the batched scoring with a fake model, the
// metrics and Megatron's printed lines, and the refusals of bad input.
#include "backend/eval/zero_shot_tasks.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/python_format.hpp"
#include "backend/data/gpt2_test_tokenizer.hpp"
#include "temporary_directory.hpp"

using namespace backend;

namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<int32_t> iota_tokens(int64_t count, int32_t first = 0) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

}  // namespace

TEST_CASE("wikitext_detokenize: each of Megatron's substitutions") {
  CHECK(wikitext_detokenize(" = = History = = \n") == " == History ==\n");
  CHECK(wikitext_detokenize(" = = = Later years = = = \n") == " === Later years ===\n");
  CHECK(wikitext_detokenize("= = = = Deep = = = =") == "==== Deep ====");
  CHECK(wikitext_detokenize("in 1874 @-@ 1876 , 21 @.@ 5 m and 2 @,@ 400 pounds") ==
        "in 1874-1876, 21.5 m and 2,400 pounds");
  CHECK(wikitext_detokenize("a : b ; c . d ! e ? f , g") == "a: b; c. d! e? f, g");
  CHECK(wikitext_detokenize("stands ( 70 ft ) tall [ 1 ] { x }") == "stands (70 ft) tall [1] {x}");
  CHECK(wikitext_detokenize("asked for \" a proper light \" and \" more \"") ==
        "asked for \"a proper light\" and \"more\"");
  CHECK(wikitext_detokenize("the keeper 's cottage") == "the keeper's cottage");
  CHECK(wikitext_detokenize("the keepers ' lamp") == "the keepers' lamp");
  CHECK(wikitext_detokenize("a N b") == "a 1 b");
  // " ° " loses both spaces, as Megatron's replacement does.
  CHECK(wikitext_detokenize("40 \u00b0 at") == "40\u00b0at");
  // Megatron's r"/' [0-9]/" matches those five characters literally.
  CHECK(wikitext_detokenize("x/' 5/y") == "x/'[0-9]/y");
  CHECK(wikitext_detokenize("x/' 5 y") == "x/' 5 y");
  // A pair runs from an opening to the next closing; an opening without one is left alone.
  CHECK(wikitext_detokenize("( a ( b ) c )") == "(a ( b) c )");
  CHECK(wikitext_detokenize("a ( b") == "a ( b");
  // The whitespace inside a pair includes newlines.
  CHECK(wikitext_detokenize("( a\n )") == "(a)");
  // Each replacement is one pass over non-overlapping occurrences (Python's str.replace).
  CHECK(wikitext_detokenize("a N N b") == "a 1 N b");
  CHECK(wikitext_detokenize("x  \n  y") == "x \n y");
}

TEST_CASE("ptb_detokenize and the choice of detokenizer by the file's name") {
  CHECK(ptb_detokenize("it is n't the $ 1 price , is it ' N cents") ==
        "it isn't the $1 price , is it'1 cents");
  CHECK(detokenizer_for_path("/data/wikitext-103/wiki.test.tokens") == Detokenizer::wikitext);
  CHECK(detokenizer_for_path("/data/ptb/wiki.txt") == Detokenizer::ptb);  // "ptb" comes first
  CHECK(detokenizer_for_path("/data/lambada_test.jsonl") == Detokenizer::lambada);
  CHECK(detokenize(Detokenizer::lambada, " a , b ") == " a , b ");
  CHECK_THROWS_WITH_AS(detokenizer_for_path("/data/valid.txt"),
                       doctest::Contains("must contain 'wiki'"), common::Error);
}

TEST_CASE("count_original_words is Python's len(text.strip().split(SPACE))") {
  CHECK(count_original_words("a b c") == 3);
  CHECK(count_original_words("  a b\nc  d  \n") == 4);  // ['a', 'b\nc', '', 'd']
  CHECK(count_original_words(" \n = Title = \n \n Text . \n") == 7);
  CHECK(count_original_words("word") == 1);
}

TEST_CASE("wikitext windows: overlapping windows score every target once, the rest is context") {
  const std::vector<int32_t> tokens = iota_tokens(10);
  constexpr int32_t kPad = 99;
  // 9 targets, --seq-length 4, --overlapping-eval 2: ceil((9 − 2) / 2) + 1 = 5 windows.
  CHECK(wikitext_window_count(10, 4, 2) == 5);
  const std::vector<EvaluationWindow> expected = {
      {{0, 1, 2, 3, 4}, {1, 1, 1, 1}},
      {{2, 3, 4, 5, 6}, {0, 0, 1, 1}},
      {{4, 5, 6, 7, 8}, {0, 0, 1, 1}},
      {{6, 7, 8, 9, kPad}, {0, 0, 1, 0}},
      {{8, 9, kPad, kPad, kPad}, {0, 0, 0, 0}},  // Megatron's last window scores nothing here
  };
  for (int64_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    const EvaluationWindow window = wikitext_window(tokens, i, 4, 2, kPad);
    CHECK(window.tokens == expected[static_cast<size_t>(i)].tokens);
    CHECK(window.mask == expected[static_cast<size_t>(i)].mask);
  }
  // Windows that do not overlap (--overlapping-eval = --seq-length).
  CHECK(wikitext_window_count(10, 4, 4) == 3);
  CHECK(wikitext_window(tokens, 1, 4, 4, kPad).mask == std::vector<uint8_t>{1, 1, 1, 1});
  CHECK(wikitext_window(tokens, 2, 4, 4, kPad).tokens == std::vector<int32_t>{8, 9, kPad, kPad, kPad});
  CHECK(wikitext_window(tokens, 2, 4, 4, kPad).mask == std::vector<uint8_t>{1, 0, 0, 0});
  // A text shorter than one window: one padded window.
  CHECK(wikitext_window_count(3, 8, 8) == 1);
  CHECK(wikitext_window(iota_tokens(3), 0, 8, 8, kPad).mask ==
        std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("wikitext windows: every target id is scored exactly once, whatever the sizes") {
  for (int64_t count : {2, 3, 7, 16, 17, 50}) {
    for (int64_t seq_length : {1, 4, 8}) {
      for (int64_t overlap = 1; overlap <= seq_length; ++overlap) {
        CAPTURE(count);
        CAPTURE(seq_length);
        CAPTURE(overlap);
        const std::vector<int32_t> tokens = iota_tokens(count);
        std::vector<int> scored(static_cast<size_t>(count), 0);
        const int64_t windows = wikitext_window_count(count, seq_length, overlap);
        for (int64_t w = 0; w < windows; ++w) {
          const EvaluationWindow window = wikitext_window(tokens, w, seq_length, overlap, -1);
          for (int64_t p = 0; p < seq_length; ++p) {
            if (window.mask[static_cast<size_t>(p)] == 0) continue;
            const int32_t label = window.tokens[static_cast<size_t>(p + 1)];
            REQUIRE(label >= 1);  // never the padding, never the first id
            ++scored[static_cast<size_t>(label)];
          }
        }
        CHECK(std::count(scored.begin() + 1, scored.end(), 1) == count - 1);
      }
    }
  }
}

TEST_CASE("--overlapping-eval must lie between 1 and --seq-length") {
  CHECK_NOTHROW(check_overlapping_eval(4, 4));
  CHECK_THROWS_WITH_AS(check_overlapping_eval(32, 16),
                       doctest::Contains("--overlapping-eval 32 exceeds --seq-length 16"),
                       common::Error);
  CHECK_THROWS_WITH_AS(check_overlapping_eval(0, 16), doctest::Contains("at least 1"),
                       common::Error);
  CHECK_THROWS_AS(wikitext_window_count(10, 4, 5), common::Error);
}

TEST_CASE("LAMBADA targets: the last token, or with --strict-lambada the whole last word") {
  auto tokenizer = test_support::gpt2_tokenizer();
  const std::string text = "The keepers walked along the breakwater";
  const std::vector<int32_t> all = tokenizer->tokenize(text);
  const LambadaExample loose = lambada_example(text, *tokenizer, false);
  CHECK(loose.target == std::vector<int32_t>{all.back()});
  CHECK(loose.context == std::vector<int32_t>(all.begin(), all.end() - 1));

  const LambadaExample strict = lambada_example(text + " \n", *tokenizer, true);
  CHECK(strict.context == tokenizer->tokenize("The keepers walked along the"));
  CHECK(strict.target == tokenizer->tokenize(" breakwater"));
  REQUIRE(strict.target.size() == 2);  // " break" "water": the strict target is two ids
  // The context is stripped of the whitespace before the word.
  CHECK(lambada_example("a  b\t\n word", *tokenizer, true).context == tokenizer->tokenize("a  b"));
}

TEST_CASE("LAMBADA windows: context + target, padded, the mask over the predictions of the target") {
  const LambadaExample example{.context = {5, 6, 7}, .target = {8, 9}};
  const EvaluationWindow window = lambada_window(example, 6, 0);
  CHECK(window.tokens == std::vector<int32_t>{5, 6, 7, 8, 9, 0, 0});
  CHECK(window.mask == std::vector<uint8_t>{0, 0, 1, 1, 0, 0});
  // Exactly seq_length + 1 ids fit.
  CHECK(lambada_window(example, 4, 0).mask == std::vector<uint8_t>{0, 0, 1, 1});
  CHECK_THROWS_WITH_AS(lambada_window(example, 3, 0), doctest::Contains("--seq-length 3"),
                       common::Error);
}

TEST_CASE("scoring: masked losses summed over batches, examples right at every target id") {
  // A fake model whose loss at a position is its label: the total is the sum of the scored
  // labels, which is every id after the first exactly once, whatever the batching.
  WindowScorer scorer;
  scorer.losses = [](std::span<const int32_t>, std::span<const int32_t> labels, int64_t) {
    return std::vector<double>(labels.begin(), labels.end());
  };
  const std::vector<int32_t> tokens = iota_tokens(23, 1);  // 1 .. 23
  const double expected = 23 * 24 / 2 - 1;
  for (int64_t batch : {1, 2, 3, 8}) {
    std::vector<int64_t> batches;
    CHECK(wikitext_total_loss(tokens, 5, 2, 1000, batch, scorer,
                              [&](int64_t b) { batches.push_back(b); }) == expected);
    CHECK(std::ssize(batches) == (wikitext_window_count(23, 5, 2) + batch - 1) / batch);
    CHECK(wikitext_total_loss(tokens, 5, 5, 1000, batch, scorer) == expected);
  }

  // A fake model that predicts every label except 9: an example is wrong when a target id is 9,
  // whatever its context.
  scorer.argmax = [](std::span<const int32_t>, std::span<const int32_t> labels, int64_t) {
    std::vector<int32_t> argmax(labels.begin(), labels.end());
    for (auto& id : argmax) id = id == 9 ? 0 : id;
    return argmax;
  };
  const std::vector<LambadaExample> examples = {
      {.context = {9, 9}, .target = {1}},     // right: the context's 9s are not scored
      {.context = {1}, .target = {2, 9}},     // wrong: the target's second id
      {.context = {1, 2}, .target = {3, 4}},  // right
      {.context = {1}, .target = {9}},        // wrong
      {.context = {4, 5}, .target = {6}},     // right
  };
  for (int64_t batch : {1, 2, 5, 7}) {
    CHECK(lambada_correct(examples, 4, 9, batch, scorer) == 3);  // the padding (9) unscored
  }
}

TEST_CASE("the metrics and Megatron's printed lines") {
  const PerplexityResult r = perplexity_result(20.0, 11, 6);
  CHECK(r.avg_loss == 2.0);
  CHECK(r.token_ratio == 2.0);
  CHECK(r.ppl == doctest::Approx(std::exp(2.0)));
  CHECK(r.adjusted_ppl == doctest::Approx(std::exp(4.0)));
  const std::vector<std::string> lines = format_results("WIKITEXT103", r);
  REQUIRE(lines.size() == 3);
  CHECK(lines[1] == " validation results on WIKITEXT103 | avg loss: 2.0000E+00 | ppl: 7.3891E+00 | "
                    "adjusted ppl: 5.4598E+01 | token ratio: 2.0 |");
  CHECK(lines[0] == std::string(lines[1].size() + 1, '-'));
  CHECK(lines[2] == lines[0]);
  // Both perplexities are capped at exp(20).
  const PerplexityResult high = perplexity_result(300.0, 11, 2);
  CHECK(high.ppl == doctest::Approx(std::exp(20.0)));
  CHECK(high.adjusted_ppl == doctest::Approx(std::exp(20.0)));

  const std::vector<std::string> accuracy = format_results("LAMBADA", accuracy_result(3, 5));
  CHECK(accuracy[1] == " validation results on LAMBADA | number correct: 3.0000E+00 | total "
                       "examples: 5.0000E+00 | avg accuracy: 6.0000E-01");
  CHECK(accuracy[0].size() == accuracy[1].size() + 1);

  CHECK(common::format_python_float(1.0) == "1.0");
  CHECK(common::format_python_float(1.25) == "1.25");
  CHECK(common::format_python_float(1.021551724137931) == "1.021551724137931");
  CHECK(common::format_python_float(0.1) == "0.1");
  CHECK(common::format_python_float(1e-5) == "1e-05");
  CHECK(common::format_python_float(1e16) == "1e+16");
  CHECK(format_megatron_e4(12345.678) == "1.2346E+04");
  CHECK(format_megatron_e4(0.0) == "0.0000E+00");
}

TEST_CASE("read_wikitext counts the raw words and tokenizes the detokenized text") {
  test_support::TemporaryDirectory temporary;
  auto tokenizer = test_support::gpt2_tokenizer();
  const auto path = temporary.path / "wiki.test.tokens";
  write(path, " = Title = \n The tower is 21 @.@ 5 m tall . \n");
  const WikitextText text = read_wikitext(path, *tokenizer);
  CHECK(text.num_original_tokens == 13);
  CHECK(text.tokens == tokenizer->tokenize(" = Title =\nThe tower is 21.5 m tall.\n"));
  CHECK(text.num_tokenized_tokens == std::ssize(text.tokens));

  write(temporary.path / "wiki.empty", " \n \n");
  CHECK_THROWS_WITH_AS(read_wikitext(temporary.path / "wiki.empty", *tokenizer),
                       doctest::Contains("wiki.empty: the file holds no text"), common::Error);
  write(temporary.path / "wiki.one", "word");
  CHECK_THROWS_WITH_AS(read_wikitext(temporary.path / "wiki.one", *tokenizer),
                       doctest::Contains("at least two"), common::Error);
  const std::string missing = "cannot read --valid-data " +
                              (temporary.path / "wiki.missing").string() +
                              ": No such file or directory";
  CHECK_THROWS_WITH_AS(read_wikitext(temporary.path / "wiki.missing", *tokenizer),
                       doctest::Contains(missing.c_str()), common::Error);
  write(temporary.path / "valid.txt", "some text here");
  CHECK_THROWS_WITH_AS(read_wikitext(temporary.path / "valid.txt", *tokenizer),
                       doctest::Contains("'wiki'"), common::Error);
}

TEST_CASE("read_lambada: one JSON object with a text per line, bad lines named by number") {
  test_support::TemporaryDirectory temporary;
  auto tokenizer = test_support::gpt2_tokenizer();
  const auto path = temporary.path / "lambada.jsonl";
  write(path, "{\"text\": \"the cat sat on the mat\"}\n\n{\"text\": \"a dog ran\"}\n");
  const std::vector<LambadaExample> examples = read_lambada(path, *tokenizer, false, 32);
  REQUIRE(examples.size() == 2);
  CHECK(examples[0].line == 1);
  CHECK(examples[1].line == 3);  // the blank line is skipped, the numbers stay the file's
  CHECK(examples[1].target == tokenizer->tokenize(" ran"));

  auto refused = [&](const std::string& content, const std::string& message, int64_t seq = 32) {
    CAPTURE(content);
    write(path, content);
    CHECK_THROWS_WITH_AS(read_lambada(path, *tokenizer, true, seq), doctest::Contains(message.c_str()),
                         common::Error);
  };
  refused("{\"text\": \"a b\"}\n{\"txt\": \"a b\"}\n", "lambada.jsonl line 2: no \"text\" key");
  refused("{\"text\": \"a b\"}\nnot json\n", "line 2: not JSON");
  refused("[\"a\"]\n", "line 1: no \"text\" key");
  refused("{\"text\": 5}\n", "line 1: \"text\" is not a string");
  refused("{\"text\": \"   \"}\n", "line 1: the text \"   \" has no tokens");
  refused("{\"text\": \"alone\"}\n", "line 1: nothing comes before the last word");
  refused("{\"text\": \"one two three four five six\"}\n",
          "line 1: the example is 6 tokens, longer than --seq-length 4 + 1", 4);
  refused("\n \n", "holds no examples");
}

TEST_CASE("an evaluation file that is not a regular file is refused saying what it is") {
  test_support::TemporaryDirectory temporary;
  auto tokenizer = test_support::gpt2_tokenizer();
  const auto fifo = temporary.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto loop = temporary.path / "loop";
  std::filesystem::create_symlink(loop, loop);
  const std::vector<std::pair<std::filesystem::path, std::string>> cases = {
      {temporary.path, "it is a directory, not a file"},
      {fifo, "it is a FIFO (named pipe), not a regular file"},
      {"/dev/zero", "it is a character device, not a regular file"},
      {loop, "Too many levels of symbolic links"}};
  for (const auto& [path, what] : cases) {
    const std::string message = "cannot read --valid-data " + path.string() + ": " + what;
    CHECK_THROWS_WITH_AS(read_wikitext(path, *tokenizer), doctest::Contains(message.c_str()),
                         common::Error);
    CHECK_THROWS_WITH_AS(read_lambada(path, *tokenizer, false, 64),
                         doctest::Contains(message.c_str()), common::Error);
  }
}
