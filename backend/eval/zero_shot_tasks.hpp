// Megatron-LM's zero-shot GPT tasks (tasks/zeroshot_gpt: datasets.py, detokenizer.py,
// evaluate.py), as functions that evaluate_gpt composes and the tests check one by one:
//
// WIKITEXT103, word-level perplexity. The file is read whole; num_original_tokens is the number
// of words of the raw text as Python's text.strip().split(" ") counts them (every single space
// separates, newlines do not). The text is then detokenized (the detokenizer is chosen by the
// file's name, as Megatron's get_detokenizer: "ptb", else "wiki", else "lambada" in the path)
// and tokenized whole; num_tokenized_tokens is the number of ids. The ids are cut into windows
// of seq_length + 1 ids: window i starts at i × overlapping_eval, the last ones are padded with
// the tokenizer's EOD, and the model scores positions 0 .. seq_length − 1 (input ids [0, T),
// labels [1, T]) where the mask is 1: not the padding, and, in every window but the first when
// overlapping_eval < seq_length, only the last overlapping_eval positions (the earlier ones
// were scored by an earlier window, and serve here as context). So every id after the first
// is scored exactly once. With L the sum of the scored losses:
//   avg loss     = L / (num_tokenized_tokens − 1)
//   ppl          = exp(min(20, avg loss))
//   token ratio  = (num_tokenized_tokens − 1) / (num_original_tokens − 1)
//   adjusted ppl = exp(min(20, avg loss × token ratio))      (perplexity per original word)
//
// LAMBADA, cloze accuracy. One JSON object per line with the passage in "text". The target is
// the last token of the tokenized text (default), or with --strict-lambada the whole last word:
// the text before the last whitespace-separated word, stripped, is tokenized as the context and
// " " + the word as the target, which may be several ids. An example is one window (context +
// target, EOD-padded to seq_length + 1) whose mask covers the positions that predict the target
// ids; it is correct when the argmax of the logits equals the target at every one of them.
// accuracy = correct / examples.
//
// Where Megatron would crash or silently do something else, these refuse with a common::Error
// naming the file (and line), flag and value: an empty text, a text of fewer than two ids or
// words (the averages divide by count − 1), --overlapping-eval above --seq-length (Megatron's
// windows would then skip ids), a LAMBADA example longer than seq_length + 1 ids or with no
// context before its target, a line that is not a JSON object with a string "text".
//
// Whitespace: Python's str.strip(), str.split() and the regular expressions' \s also treat
// non-ASCII spaces (U+00A0, U+2000..U+200A, ...) as whitespace; these functions treat the ASCII
// ones (space, \t, \n, \v, \f, \r and \x1c..\x1f, as Python does) and no others.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/data/tokenizer.hpp"

namespace backend {

// ---- detokenizers (Megatron's detokenizer.py, replacement for replacement, in its order)
std::string wikitext_detokenize(std::string_view text);
std::string ptb_detokenize(std::string_view text);

enum class Detokenizer { ptb, wikitext, lambada };
// Megatron's get_detokenizer: the first of "ptb", "wiki", "lambada" that the path contains.
// A path with none of them is a common::Error (Megatron would fail calling None).
Detokenizer detokenizer_for_path(const std::string& path);
std::string detokenize(Detokenizer detokenizer, std::string_view text);  // lambada: unchanged

// Python's len(text.strip().split(" ")): the spaces of the stripped text, plus one.
int64_t count_original_words(std::string_view text);

// One model input of either task: seq_length + 1 ids (inputs [0, T), labels [1, T]) and the
// seq_length mask of the positions whose labels count.
struct EvaluationWindow {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

// ---- WIKITEXT103
struct WikitextText {
  std::vector<int32_t> tokens;  // the detokenized text, tokenized
  int64_t num_original_tokens = 0;
  int64_t num_tokenized_tokens = 0;
};
// Reads `path` whole (bytes as they are), counts its words, detokenizes (by the path's name)
// and tokenizes it. `flag` names the flag the path came from, for the errors.
WikitextText read_wikitext(const std::filesystem::path& path, Tokenizer& tokenizer,
                           const std::string& flag = "--valid-data");

// Megatron's _LMDataset: max(ceil(max(num_tokens − 1 − overlapping_eval, 0) / overlapping_eval)
// + 1, 1) windows.
int64_t wikitext_window_count(int64_t num_tokens, int64_t seq_length, int64_t overlapping_eval);
// Window `index` of `tokens`, padded with `pad` (the EOD).
EvaluationWindow wikitext_window(std::span<const int32_t> tokens, int64_t index,
                                 int64_t seq_length, int64_t overlapping_eval, int32_t pad);
// The flags' rules between each other: 1 ≤ overlapping_eval ≤ seq_length (common::Error
// naming both flags otherwise).
void check_overlapping_eval(int64_t overlapping_eval, int64_t seq_length);

// ---- LAMBADA
struct LambadaExample {
  std::vector<int32_t> context;
  std::vector<int32_t> target;
  int64_t line = 0;  // 1-based line of the file
};
// The context and target of one passage (Megatron's _LambadaDataset.get_tokens).
LambadaExample lambada_example(std::string_view text, Tokenizer& tokenizer, bool strict);
// The "text" of every line of a LAMBADA .jsonl file, with its 1-based line number; lines of
// whitespace only are skipped.
std::vector<std::pair<int64_t, std::string>> read_lambada_texts(const std::filesystem::path& path);
// Every example of the file; one with no context, or longer than seq_length + 1 ids, is a
// common::Error naming the file and line.
std::vector<LambadaExample> read_lambada(const std::filesystem::path& path, Tokenizer& tokenizer,
                                         bool strict, int64_t seq_length);
// The example as a window: context + target, EOD-padded; the mask covers the target's
// predictions (positions |context| − 1 .. |context| + |target| − 2).
EvaluationWindow lambada_window(const LambadaExample& example, int64_t seq_length, int32_t pad);

// ---- scoring
// The model as the metrics see it: forwards `batch` windows' inputs and labels ((batch,
// seq_length) each, row-major) and returns per position either the cross-entropy loss or the
// argmax of the logits (batch × seq_length values).
struct WindowScorer {
  std::function<std::vector<double>(std::span<const int32_t> inputs,
                                    std::span<const int32_t> labels, int64_t batch)>
      losses;
  std::function<std::vector<int32_t>(std::span<const int32_t> inputs,
                                     std::span<const int32_t> labels, int64_t batch)>
      argmax;
};

// Sum of the masked losses over all windows, in batches of micro_batch_size windows (the last
// may be smaller, as Megatron's data loader with drop_last=False). Accumulated in double.
// `progress(batch_index)` is called before each batch (may be empty).
double wikitext_total_loss(std::span<const int32_t> tokens, int64_t seq_length,
                           int64_t overlapping_eval, int32_t pad, int64_t micro_batch_size,
                           const WindowScorer& scorer,
                           const std::function<void(int64_t)>& progress = {});
// How many examples the model gets right (every target id the argmax).
int64_t lambada_correct(std::span<const LambadaExample> examples, int64_t seq_length, int32_t pad,
                        int64_t micro_batch_size, const WindowScorer& scorer,
                        const std::function<void(int64_t)>& progress = {});

// ---- results, as evaluate.py computes and prints them
struct PerplexityResult {
  double total_loss = 0;
  int64_t num_original_tokens = 0;
  int64_t num_tokenized_tokens = 0;
  double avg_loss = 0;
  double ppl = 0;
  double adjusted_ppl = 0;
  double token_ratio = 0;
};
PerplexityResult perplexity_result(double total_loss, int64_t num_tokenized_tokens,
                                   int64_t num_original_tokens);

struct AccuracyResult {
  int64_t number_correct = 0;
  int64_t total_examples = 0;
  double avg_accuracy = 0;
};
AccuracyResult accuracy_result(int64_t number_correct, int64_t total_examples);

// Python's '{:.4E}'.format(value): 1.2346E+01.
std::string format_megatron_e4(double value);

// The three lines Megatron prints: a rule of '-', the results, the same rule again:
//  " validation results on WIKITEXT103 | avg loss: 1.2345E+00 | ppl: ... | adjusted ppl: ... |
//   token ratio: 1.25 |" and " validation results on LAMBADA | number correct: 3.0000E+00 |
//   total examples: 5.0000E+00 | avg accuracy: 6.0000E-01".
std::vector<std::string> format_results(const std::string& task, const PerplexityResult& result);
std::vector<std::string> format_results(const std::string& task, const AccuracyResult& result);

}  // namespace backend
