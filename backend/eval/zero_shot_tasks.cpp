// Megatron-LM's zero-shot GPT tasks, WIKITEXT103 and LAMBADA; see zero_shot_tasks.hpp.
// Reference (read for the semantics, not copied): Megatron-LM tasks/zeroshot_gpt/datasets.py,
// detokenizer.py and evaluate.py.
#include "backend/eval/zero_shot_tasks.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "backend/common/error.hpp"
#include "backend/common/python_format.hpp"
#include "backend/common/small_file.hpp"

namespace backend {

namespace {

// Python's whitespace among the ASCII characters (str.isspace, and \s of str patterns).
bool is_python_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' ||
         (c >= '\x1c' && c <= '\x1f');
}

std::string_view strip(std::string_view text) {
  while (!text.empty() && is_python_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_python_space(text.back())) text.remove_suffix(1);
  return text;
}

// Python's str.replace: every non-overlapping occurrence, left to right, in one pass.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string result;
  result.reserve(text.size());
  size_t position = 0;
  for (size_t found; (found = text.find(from, position)) != std::string_view::npos;
       position = found + from.size()) {
    result.append(text.substr(position, found - position));
    result.append(to);
  }
  result.append(text.substr(position));
  return result;
}

// re.sub(r"O\s*([^C]*?)\s*C", r"O\1C", text) for the opening O and closing C: from each O
// (left to right, after the previous match) to the next C, the text between them loses its
// leading and trailing whitespace. An O with no C after it matches nothing, and then neither
// does any later O.
std::string tighten_pairs(std::string_view text, char open, char close) {
  std::string result;
  result.reserve(text.size());
  size_t position = 0;
  while (position < text.size()) {
    const size_t opening = text.find(open, position);
    if (opening == std::string_view::npos) break;
    const size_t closing = text.find(close, opening + 1);
    if (closing == std::string_view::npos) break;
    result.append(text.substr(position, opening - position));
    result.push_back(open);
    result.append(strip(text.substr(opening + 1, closing - opening - 1)));
    result.push_back(close);
    position = closing + 1;
  }
  result.append(text.substr(position));
  return result;
}

// re.sub(r"/' [0-9]/", r"/'[0-9]/", text): Megatron's pattern, taken literally as Python does
// (the slashes are characters, the replacement the text "/'[0-9]/").
std::string replace_slash_quote_digit(std::string_view text) {
  std::string result;
  size_t position = 0;
  for (size_t found; (found = text.find("/' ", position)) != std::string_view::npos;) {
    if (found + 4 < text.size() && text[found + 3] >= '0' && text[found + 3] <= '9' &&
        text[found + 4] == '/') {
      result.append(text.substr(position, found - position));
      result.append("/'[0-9]/");
      position = found + 5;
    } else {
      result.append(text.substr(position, found + 1 - position));
      position = found + 1;
    }
  }
  result.append(text.substr(position));
  return result;
}

// An evaluation file is read whole, through the one reader of such files: what is not a
// regular file is refused saying what it is ("it is a directory, not a file", "it is a FIFO
// (named pipe), ...", "Too many levels of symbolic links"), not as missing. The limit is 4 ×
// common::kSmallFileLimit (1 GiB): WikiText-103's test file is 1.3 MB, LAMBADA's 1.8 MB.
constexpr uint64_t kEvaluationFileLimit = 4 * common::kSmallFileLimit;

std::string read_whole_file(const std::filesystem::path& path, const std::string& flag) {
  return common::read_small_file(path, flag, kEvaluationFileLimit);
}

std::string python_quote(const std::string& text) { return nlohmann::json(text).dump(); }

}  // namespace

std::string wikitext_detokenize(std::string_view input) {
  std::string s(input);
  // contractions
  s = replace_all(s, "s '", "s'");
  s = replace_slash_quote_digit(s);
  // number separators
  s = replace_all(s, " @-@ ", "-");
  s = replace_all(s, " @,@ ", ",");
  s = replace_all(s, " @.@ ", ".");
  // punctuation
  for (const char* mark : {":", ";", ".", "!", "?", ","}) {
    s = replace_all(s, fmt::format(" {} ", mark), fmt::format("{} ", mark));
  }
  // brackets and quotes
  s = tighten_pairs(s, '(', ')');
  s = tighten_pairs(s, '[', ']');
  s = tighten_pairs(s, '{', '}');
  s = tighten_pairs(s, '"', '"');
  s = tighten_pairs(s, '\'', '\'');
  // headings and the rest
  s = replace_all(s, "= = = =", "====");
  s = replace_all(s, "= = =", "===");
  s = replace_all(s, "= =", "==");
  s = replace_all(s, " \u00b0 ", "\u00b0");
  s = replace_all(s, " \n", "\n");
  s = replace_all(s, "\n ", "\n");
  s = replace_all(s, " N ", " 1 ");
  s = replace_all(s, " 's", "'s");
  return s;
}

std::string ptb_detokenize(std::string_view input) {
  std::string s(input);
  s = replace_all(s, " '", "'");
  s = replace_all(s, " \n", "\n");
  s = replace_all(s, "\n ", "\n");
  s = replace_all(s, " n't", "n't");
  s = replace_all(s, " N ", "1 ");
  s = replace_all(s, "$ 1", "$1");
  s = replace_all(s, "# 1", "#1");
  return s;
}

Detokenizer detokenizer_for_path(const std::string& path) {
  if (path.find("ptb") != std::string::npos) return Detokenizer::ptb;
  if (path.find("wiki") != std::string::npos) return Detokenizer::wikitext;
  if (path.find("lambada") != std::string::npos) return Detokenizer::lambada;
  common::fail("--valid-data {}: Megatron chooses the detokenizer by the file's path, which must "
               "contain 'wiki' (WikiText: wiki.test.tokens), 'ptb' (Penn Treebank) or 'lambada' "
               "(no detokenizing); rename the file or link it under such a name",
               path);
}

std::string detokenize(Detokenizer detokenizer, std::string_view text) {
  switch (detokenizer) {
    case Detokenizer::ptb:
      return ptb_detokenize(text);
    case Detokenizer::wikitext:
      return wikitext_detokenize(text);
    case Detokenizer::lambada:
      break;
  }
  return std::string(text);
}

int64_t count_original_words(std::string_view text) {
  const std::string_view stripped = strip(text);
  return static_cast<int64_t>(std::count(stripped.begin(), stripped.end(), ' ')) + 1;
}

WikitextText read_wikitext(const std::filesystem::path& path, Tokenizer& tokenizer,
                           const std::string& flag) {
  const std::string raw = read_whole_file(path, flag);
  if (strip(raw).empty()) common::fail("{} {}: the file holds no text", flag, path.string());
  WikitextText text;
  text.num_original_tokens = count_original_words(raw);
  const std::string detokenized = detokenize(detokenizer_for_path(path.string()), raw);
  text.tokens = tokenizer.tokenize(detokenized);
  text.num_tokenized_tokens = std::ssize(text.tokens);
  if (text.num_original_tokens < 2 || text.num_tokenized_tokens < 2) {
    common::fail("{} {}: the text has {} word(s) and {} token(s); perplexity needs at least two "
                 "of each (it averages over all but the first)",
                 flag, path.string(), text.num_original_tokens, text.num_tokenized_tokens);
  }
  return text;
}

void check_overlapping_eval(int64_t overlapping_eval, int64_t seq_length) {
  if (overlapping_eval < 1) {
    common::fail("--overlapping-eval {}: must be at least 1", overlapping_eval);
  }
  if (overlapping_eval > seq_length) {
    common::fail("--overlapping-eval {} exceeds --seq-length {}: each window would then skip "
                 "{} tokens unscored; pass --overlapping-eval {} for windows that do not overlap, "
                 "or less for overlapping ones (Megatron's default is 32)",
                 overlapping_eval, seq_length, overlapping_eval - seq_length, seq_length);
  }
}

int64_t wikitext_window_count(int64_t num_tokens, int64_t seq_length, int64_t overlapping_eval) {
  check_overlapping_eval(overlapping_eval, seq_length);
  const int64_t targets = std::max<int64_t>(num_tokens - 1 - overlapping_eval, 0);
  return std::max<int64_t>((targets + overlapping_eval - 1) / overlapping_eval + 1, 1);
}

EvaluationWindow wikitext_window(std::span<const int32_t> tokens, int64_t index,
                                 int64_t seq_length, int64_t overlapping_eval, int32_t pad) {
  check_overlapping_eval(overlapping_eval, seq_length);
  const int64_t count = std::ssize(tokens);
  const int64_t start = std::min(index * overlapping_eval, count);
  const int64_t end = std::min(start + seq_length + 1, count);
  EvaluationWindow window;
  window.tokens.assign(tokens.begin() + start, tokens.begin() + end);
  const int64_t real = std::ssize(window.tokens);
  window.tokens.resize(static_cast<size_t>(seq_length + 1), pad);
  // Position p predicts id p + 1 of the window: scored where that id is real.
  window.mask.assign(static_cast<size_t>(seq_length), 0);
  for (int64_t p = 0; p + 1 < real; ++p) window.mask[static_cast<size_t>(p)] = 1;
  if (overlapping_eval != seq_length && index != 0) {
    // Only the last overlapping_eval positions are new; the earlier ones are context.
    std::fill(window.mask.begin(), window.mask.end() - overlapping_eval, 0);
  }
  return window;
}

LambadaExample lambada_example(std::string_view text, Tokenizer& tokenizer, bool strict) {
  LambadaExample example;
  if (!strict) {
    std::vector<int32_t> ids = tokenizer.tokenize(text);
    if (!ids.empty()) {
      example.target = {ids.back()};
      ids.pop_back();
    }
    example.context = std::move(ids);
    return example;
  }
  // The last whitespace-separated word (text.split()[-1]) and where it starts.
  const std::string_view stripped = strip(text);
  if (stripped.empty()) return example;
  size_t word_start = stripped.size();
  while (word_start > 0 && !is_python_space(stripped[word_start - 1])) --word_start;
  const std::string_view last_word = stripped.substr(word_start);
  const size_t start = text.rfind(last_word);
  example.context = tokenizer.tokenize(strip(text.substr(0, start)));
  std::string spaced_word(1, ' ');
  spaced_word.append(last_word);
  example.target = tokenizer.tokenize(spaced_word);
  return example;
}

std::vector<std::pair<int64_t, std::string>> read_lambada_texts(const std::filesystem::path& path) {
  std::istringstream in(read_whole_file(path, "--valid-data"));
  std::vector<std::pair<int64_t, std::string>> texts;
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (strip(line).empty()) continue;
    const std::string where = fmt::format("--valid-data {} line {}", path.string(), line_number);
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& error) {
      common::fail("{}: not JSON ({}); LAMBADA's format is one object {{\"text\": \"...\"}} "
                   "per line", where, error.what());
    }
    if (!object.is_object() || !object.contains("text")) {
      common::fail("{}: no \"text\" key; LAMBADA's format is one object {{\"text\": \"...\"}} "
                   "per line", where);
    }
    if (!object["text"].is_string()) common::fail("{}: \"text\" is not a string", where);
    texts.emplace_back(line_number, object["text"].get<std::string>());
  }
  if (texts.empty()) common::fail("--valid-data {}: the file holds no examples", path.string());
  return texts;
}

std::vector<LambadaExample> read_lambada(const std::filesystem::path& path, Tokenizer& tokenizer,
                                         bool strict, int64_t seq_length) {
  std::vector<LambadaExample> examples;
  for (const auto& [line, text] : read_lambada_texts(path)) {
    LambadaExample example = lambada_example(text, tokenizer, strict);
    example.line = line;
    const std::string where = fmt::format("--valid-data {} line {}", path.string(), line);
    if (example.target.empty()) common::fail("{}: the text {} has no tokens", where, python_quote(text));
    if (example.context.empty()) {
      common::fail("{}: nothing comes before the {} to predict, so there is nothing to predict it "
                   "from", where, strict ? "last word" : "last token");
    }
    const int64_t length = std::ssize(example.context) + std::ssize(example.target);
    if (length > seq_length + 1) {
      common::fail("{}: the example is {} tokens, longer than --seq-length {} + 1; raise "
                   "--seq-length (up to the model's --max-position-embeddings) or shorten it",
                   where, length, seq_length);
    }
    examples.push_back(std::move(example));
  }
  return examples;
}

EvaluationWindow lambada_window(const LambadaExample& example, int64_t seq_length, int32_t pad) {
  const int64_t context = std::ssize(example.context);
  const int64_t target = std::ssize(example.target);
  if (context + target > seq_length + 1) {
    common::fail("a LAMBADA example of {} tokens is longer than --seq-length {} + 1",
                 context + target, seq_length);
  }
  EvaluationWindow window;
  window.tokens = example.context;
  window.tokens.insert(window.tokens.end(), example.target.begin(), example.target.end());
  window.tokens.resize(static_cast<size_t>(seq_length + 1), pad);
  window.mask.assign(static_cast<size_t>(seq_length), 0);
  // Megatron's pad mask [0]*|context| + [1]*|target| + [0]*pad, without its first element.
  for (int64_t p = context - 1; p < context + target - 1; ++p) {
    if (p >= 0) window.mask[static_cast<size_t>(p)] = 1;
  }
  return window;
}

namespace {

// Inputs and labels of windows [first, first + batch), (batch, seq_length) each.
void split_windows(std::span<const EvaluationWindow> windows, int64_t seq_length,
                   std::vector<int32_t>& inputs, std::vector<int32_t>& labels) {
  inputs.clear();
  labels.clear();
  for (const auto& window : windows) {
    inputs.insert(inputs.end(), window.tokens.begin(), window.tokens.begin() + seq_length);
    labels.insert(labels.end(), window.tokens.begin() + 1, window.tokens.end());
  }
}

// The batching both tasks share: windows first..first+micro_batch_size−1 of `count` (the last
// batch may be short), made by `window(i)`, split into inputs and labels, and handed with the
// batch to `score_batch`; `progress` is told each batch's index first.
void for_each_window_batch(
    int64_t count, int64_t seq_length, int64_t micro_batch_size,
    const std::function<EvaluationWindow(int64_t)>& window,
    const std::function<void(int64_t)>& progress,
    const std::function<void(std::span<const EvaluationWindow>, std::span<const int32_t> inputs,
                             std::span<const int32_t> labels)>& score_batch) {
  std::vector<EvaluationWindow> batch;
  std::vector<int32_t> inputs, labels;
  for (int64_t first = 0, batch_index = 0; first < count; first += micro_batch_size, ++batch_index) {
    if (progress) progress(batch_index);
    batch.clear();
    for (int64_t i = first; i < std::min(count, first + micro_batch_size); ++i) {
      batch.push_back(window(i));
    }
    split_windows(batch, seq_length, inputs, labels);
    score_batch(batch, inputs, labels);
  }
}

}  // namespace

double wikitext_total_loss(std::span<const int32_t> tokens, int64_t seq_length,
                           int64_t overlapping_eval, int32_t pad, int64_t micro_batch_size,
                           const WindowScorer& scorer,
                           const std::function<void(int64_t)>& progress) {
  double total = 0;
  for_each_window_batch(
      wikitext_window_count(std::ssize(tokens), seq_length, overlapping_eval), seq_length,
      micro_batch_size,
      [&](int64_t i) { return wikitext_window(tokens, i, seq_length, overlapping_eval, pad); },
      progress,
      [&](std::span<const EvaluationWindow> batch, std::span<const int32_t> inputs,
          std::span<const int32_t> labels) {
        const std::vector<double> losses = scorer.losses(inputs, labels, std::ssize(batch));
        for (size_t w = 0; w < batch.size(); ++w) {
          for (int64_t p = 0; p < seq_length; ++p) {
            if (batch[w].mask[static_cast<size_t>(p)] != 0) {
              total += losses[w * static_cast<size_t>(seq_length) + static_cast<size_t>(p)];
            }
          }
        }
      });
  return total;
}

int64_t lambada_correct(std::span<const LambadaExample> examples, int64_t seq_length, int32_t pad,
                        int64_t micro_batch_size, const WindowScorer& scorer,
                        const std::function<void(int64_t)>& progress) {
  int64_t correct = 0;
  for_each_window_batch(
      std::ssize(examples), seq_length, micro_batch_size,
      [&](int64_t i) { return lambada_window(examples[static_cast<size_t>(i)], seq_length, pad); },
      progress,
      [&](std::span<const EvaluationWindow> batch, std::span<const int32_t> inputs,
          std::span<const int32_t> labels) {
        const std::vector<int32_t> argmax = scorer.argmax(inputs, labels, std::ssize(batch));
        for (size_t w = 0; w < batch.size(); ++w) {
          bool all = true;
          for (int64_t p = 0; p < seq_length; ++p) {
            const size_t at = w * static_cast<size_t>(seq_length) + static_cast<size_t>(p);
            if (batch[w].mask[static_cast<size_t>(p)] != 0 && argmax[at] != labels[at]) all = false;
          }
          if (all) ++correct;
        }
      });
  return correct;
}

PerplexityResult perplexity_result(double total_loss, int64_t num_tokenized_tokens,
                                   int64_t num_original_tokens) {
  PerplexityResult r;
  r.total_loss = total_loss;
  r.num_tokenized_tokens = num_tokenized_tokens;
  r.num_original_tokens = num_original_tokens;
  r.avg_loss = total_loss / static_cast<double>(num_tokenized_tokens - 1);
  r.ppl = std::exp(std::min(20.0, r.avg_loss));
  r.token_ratio = static_cast<double>(num_tokenized_tokens - 1) /
                  static_cast<double>(num_original_tokens - 1);
  r.adjusted_ppl = std::exp(std::min(20.0, r.avg_loss * r.token_ratio));
  return r;
}

AccuracyResult accuracy_result(int64_t number_correct, int64_t total_examples) {
  return {.number_correct = number_correct,
          .total_examples = total_examples,
          .avg_accuracy = total_examples == 0 ? 0.0
                                              : static_cast<double>(number_correct) /
                                                    static_cast<double>(total_examples)};
}

std::string format_megatron_e4(double value) {
  if (std::isnan(value)) return "NAN";
  if (std::isinf(value)) return value > 0 ? "INF" : "-INF";
  return fmt::format("{:.4E}", value);
}

namespace {

std::vector<std::string> framed(const std::string& line) {
  const std::string rule(line.size() + 1, '-');
  return {rule, line, rule};
}

}  // namespace

std::vector<std::string> format_results(const std::string& task, const PerplexityResult& r) {
  return framed(fmt::format(" validation results on {} | avg loss: {} | ppl: {} | adjusted ppl: "
                            "{} | token ratio: {} |",
                            task, format_megatron_e4(r.avg_loss), format_megatron_e4(r.ppl),
                            format_megatron_e4(r.adjusted_ppl),
                            common::format_python_float(r.token_ratio)));
}

std::vector<std::string> format_results(const std::string& task, const AccuracyResult& r) {
  return framed(fmt::format(" validation results on {} | number correct: {} | total examples: "
                            "{} | avg accuracy: {}",
                            task, format_megatron_e4(static_cast<double>(r.number_correct)),
                            format_megatron_e4(static_cast<double>(r.total_examples)),
                            format_megatron_e4(r.avg_accuracy)));
}

}  // namespace backend
