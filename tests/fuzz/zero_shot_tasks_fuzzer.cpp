// libFuzzer target: evaluate_gpt's task files (backend/eval/zero_shot_tasks.hpp) as a user
// hands them over, a WikiText text or a LAMBADA .jsonl, read with the GPT-2 BPE tokenizer, cut
// into windows and scored. The first four bytes choose the task and the flags (the task and
// the file's name, which picks the detokenizer; --strict-lambada; --seq-length 1..64;
// --overlapping-eval 1..seq_length; --micro-batch-size 1..5); the rest is the file. Oracles:
//   WikiText: a scorer whose loss at each position is 1, then one whose loss is the label's id,
//     must total (ids − 1) and the sum of the ids after the first: every id after the first
//     scored exactly once (and each window's labels are its inputs shifted by one);
//   LAMBADA: each example's window holds context + target, and its mask covers exactly the
//     positions whose labels are the target's ids, in order; a scorer that predicts the labels
//     gets every example right, one that predicts another id none; with --strict-lambada the
//     target decodes to " " + the text's last whitespace-separated word;
//   the WikiText detokenizer's hand-written equivalents of Megatron's re.sub patterns equal
//     std::regex_replace of the same patterns (on texts short enough for std::regex's
//     recursion), ASCII whitespace being \s as zero_shot_tasks.hpp documents.
// Everything else must end in success or common::Error; a crash, another exception or a
// sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt2_bpe_tokenizer.hpp"
#include "backend/data/unicode_text.hpp"
#include "backend/eval/zero_shot_tasks.hpp"
#include "tests/fuzz/scratch_file.hpp"

namespace fs = std::filesystem;

namespace {

std::string data_file(const char* name) {
  return std::string(FUZZ_SOURCE_DIR) + "/tests/data/" + name;
}

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FINDING: zero_shot_tasks_fuzzer: %s\n", what);
    std::abort();
  }
}

// Python's str whitespace among the ASCII characters, as a std::regex class.
const char* const kSpace = "[ \\t\\n\\v\\f\\r\\x1c-\\x1f]";

// Megatron's wikitext_detokenizer with its two regular expressions run by std::regex.
std::string reference_wikitext_detokenize(std::string s) {
  const auto replace = [&s](std::string_view from, std::string_view to) {
    std::string result;
    size_t position = 0;
    for (size_t found; (found = s.find(from, position)) != std::string::npos;
         position = found + from.size()) {
      result.append(s, position, found - position).append(to);
    }
    s = result.append(s, position);
  };
  const auto substitute = [&s](const std::string& pattern, const std::string& replacement) {
    s = std::regex_replace(s, std::regex(pattern), replacement);
  };
  replace("s '", "s'");
  substitute("/' [0-9]/", "/'[0-9]/");
  replace(" @-@ ", "-");
  replace(" @,@ ", ",");
  replace(" @.@ ", ".");
  for (const char* mark : {":", ";", ".", "!", "?", ","}) {
    replace(std::string(" ") + mark + " ", std::string(mark) + " ");
  }
  const std::string space = kSpace;
  for (const auto& [open, close] :
       {std::pair{"\\(", "\\)"}, std::pair{"\\[", "\\]"}, std::pair{"\\{", "\\}"},
        std::pair{"\"", "\""}, std::pair{"'", "'"}}) {
    const std::string literal_open = open[0] == '\\' ? std::string(open + 1) : std::string(open);
    const std::string literal_close =
        close[0] == '\\' ? std::string(close + 1) : std::string(close);
    substitute(std::string(open) + space + "*([^" + close + "]*?)" + space + "*" + close,
               literal_open + "$1" + literal_close);
  }
  replace("= = = =", "====");
  replace("= = =", "===");
  replace("= =", "==");
  replace(" \u00b0 ", "\u00b0");
  replace(" \n", "\n");
  replace("\n ", "\n");
  replace(" N ", " 1 ");
  replace(" 's", "'s");
  return s;
}

bool is_python_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// text.split()[-1] (ASCII whitespace), or "" when there is no word.
std::string last_word(std::string_view text) {
  size_t end = text.size();
  while (end > 0 && is_python_space(text[end - 1])) --end;
  size_t start = end;
  while (start > 0 && !is_python_space(text[start - 1])) --start;
  return std::string(text.substr(start, end - start));
}

void check_wikitext(const fs::path& file, backend::Tokenizer& tokenizer, int64_t seq_length,
                    int64_t overlapping_eval, int64_t micro_batch_size) {
  backend::WikitextText text;
  try {
    text = backend::read_wikitext(file, tokenizer);
  } catch (const common::Error&) {
    return;
  }
  check(text.num_tokenized_tokens == std::ssize(text.tokens), "num_tokenized_tokens is not |ids|");
  check(text.num_original_tokens >= 2 && text.num_tokenized_tokens >= 2,
        "a text of fewer than two words or ids was accepted");
  const auto scorer_of = [&](bool by_id) {
    backend::WindowScorer scorer;
    scorer.losses = [&, by_id](std::span<const int32_t> inputs, std::span<const int32_t> labels,
                               int64_t batch) {
      check(batch >= 1 && batch <= micro_batch_size, "a batch of another size");
      check(std::ssize(inputs) == batch * seq_length && std::ssize(labels) == std::ssize(inputs),
            "inputs and labels are not (batch, seq_length)");
      for (int64_t row = 0; row < batch; ++row) {
        for (int64_t p = 0; p + 1 < seq_length; ++p) {
          check(labels[static_cast<size_t>(row * seq_length + p)] ==
                    inputs[static_cast<size_t>(row * seq_length + p + 1)],
                "a window's labels are not its inputs shifted by one");
        }
      }
      std::vector<double> losses(labels.size());
      for (size_t i = 0; i < labels.size(); ++i) losses[i] = by_id ? labels[i] : 1.0;
      return losses;
    };
    return scorer;
  };
  const int32_t pad = tokenizer.eod();
  const double scored = backend::wikitext_total_loss(text.tokens, seq_length, overlapping_eval, pad,
                                                     micro_batch_size, scorer_of(false));
  check(scored == static_cast<double>(text.num_tokenized_tokens - 1),
        "not every id after the first was scored exactly once");
  double ids_after_first = 0;
  for (size_t i = 1; i < text.tokens.size(); ++i) ids_after_first += text.tokens[i];
  check(backend::wikitext_total_loss(text.tokens, seq_length, overlapping_eval, pad,
                                     micro_batch_size, scorer_of(true)) == ids_after_first,
        "the scored labels are not the ids after the first");
}

void check_lambada(const fs::path& file, backend::Tokenizer& tokenizer, bool strict,
                   int64_t seq_length, int64_t micro_batch_size) {
  std::vector<backend::LambadaExample> examples;
  std::vector<std::pair<int64_t, std::string>> texts;
  try {
    examples = backend::read_lambada(file, tokenizer, strict, seq_length);
    texts = backend::read_lambada_texts(file);
  } catch (const common::Error&) {
    return;
  }
  check(examples.size() == texts.size(), "an example per text");
  const int32_t pad = tokenizer.eod();
  for (size_t e = 0; e < examples.size(); ++e) {
    const backend::LambadaExample& example = examples[e];
    check(example.line == texts[e].first, "an example's line is not its text's");
    check(!example.context.empty() && !example.target.empty(), "an empty context or target");
    const backend::EvaluationWindow window = backend::lambada_window(example, seq_length, pad);
    check(std::ssize(window.tokens) == seq_length + 1 && std::ssize(window.mask) == seq_length,
          "a window of another length");
    const int64_t context = std::ssize(example.context);
    size_t next_target = 0;
    for (int64_t p = 0; p < seq_length; ++p) {
      const bool expected = p >= context - 1 && p < context + std::ssize(example.target) - 1;
      check((window.mask[static_cast<size_t>(p)] != 0) == expected,
            "the mask is not the target's predictions");
      if (expected) {
        check(window.tokens[static_cast<size_t>(p + 1)] == example.target[next_target++],
              "a masked label is not the target's id");
      } else if (p + 1 < context) {
        check(window.tokens[static_cast<size_t>(p + 1)] ==
                  example.context[static_cast<size_t>(p + 1)],
              "the window does not start with the context");
      }
    }
    if (strict && backend::is_valid_utf8(texts[e].second)) {
      check(tokenizer.detokenize(example.target) == " " + last_word(texts[e].second),
            "the strict target is not the last word");
    }
  }
  const auto scorer_of = [&](int32_t shift) {
    backend::WindowScorer scorer;
    scorer.argmax = [shift](std::span<const int32_t>, std::span<const int32_t> labels, int64_t) {
      std::vector<int32_t> argmax(labels.begin(), labels.end());
      for (int32_t& id : argmax) id += shift;
      return argmax;
    };
    return scorer;
  };
  check(backend::lambada_correct(examples, seq_length, pad, micro_batch_size, scorer_of(0)) ==
            std::ssize(examples),
        "a model that predicts every label missed an example");
  check(backend::lambada_correct(examples, seq_length, pad, micro_batch_size, scorer_of(1)) == 0,
        "a model that predicts no label got an example right");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz_support::ScratchDirectory scratch("zero_shot_tasks_fuzzer");
  // A small word cache: the run's memory is then the readers', not the cache's (65,536 words
  // of fuzzed text by default).
  static backend::Gpt2BpeTokenizer tokenizer(
      data_file("gpt2-vocab.json"), data_file("gpt2-merges.txt"), {.word_cache_entries = 256});
  if (size < 4) return 0;
  const bool lambada = (data[0] & 1) != 0;
  const bool strict = (data[0] & 2) != 0;
  const int64_t seq_length = 1 + data[1] % 64;
  const int64_t overlapping_eval = 1 + data[2] % seq_length;
  const int64_t micro_batch_size = 1 + data[3] % 5;
  const std::string_view content(reinterpret_cast<const char*>(data) + 4, size - 4);

  if (content.size() <= 256) {
    check(backend::wikitext_detokenize(content) ==
              reference_wikitext_detokenize(std::string(content)),
          "wikitext_detokenize differs from Megatron's patterns under std::regex");
  }
  if (lambada) {
    check_lambada(scratch.write("lambada_test.jsonl", content), tokenizer, strict, seq_length,
                  micro_batch_size);
  } else {
    static const char* const kNames[] = {"wiki.test.tokens", "ptb.test.txt", "lambada_test.txt"};
    check_wikitext(scratch.write(kNames[(data[0] >> 2) % 3], content), tokenizer, seq_length,
                   overlapping_eval, micro_batch_size);
  }
  return 0;
}
