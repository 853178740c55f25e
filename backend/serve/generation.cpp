// One-prompt text generation without a KV cache, after Megatron's text_generation api
// (generation.hpp explains the rules and where they come from).
#include "backend/serve/generation.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"
#include "backend/common/utf8.hpp"
#include "backend/data/null_tokenizer.hpp"
#include "backend/serve/sampling.hpp"

namespace backend {
namespace {

// Megatron's hard-coded GPT-2 ids (generation.py's stop rules).
constexpr int32_t kNewlineId = 198;        // "\n"
constexpr int32_t kDoubleNewlineId = 628;  // "\n\n"
constexpr float kPreventedLogit = -1e10f;  // Megatron's value for "\n" after ":"

// Python's bytes.decode("utf-8", errors="replace"): each maximal ill-formed subpart becomes
// U+FFFD.
std::string replace_invalid_utf8(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int length = common::utf8_sequence_length(bytes, i);
    if (length > 0) {
      text.append(bytes.substr(i, static_cast<size_t>(length)));
      i += static_cast<size_t>(length);
    } else {
      text.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-length);
    }
  }
  return text;
}

int32_t first_id_of(Tokenizer& tokenizer, std::string_view text, std::string_view shown) {
  std::vector<int32_t> ids;
  try {
    ids = tokenizer.tokenize(text);
  } catch (const common::Error& error) {
    common::fail("prevent_newline_after_colon needs the tokenizer to tokenize {}: {}", shown,
                 error.what());
  }
  if (ids.empty()) {
    common::fail("prevent_newline_after_colon needs the tokenizer to tokenize {}; it gave no ids",
                 shown);
  }
  return ids.front();
}

// log_softmax(logits)[id] in fp64.
double log_probability(std::span<const float> logits, int32_t id) {
  const double largest = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float logit : logits) sum += std::exp(static_cast<double>(logit) - largest);
  return static_cast<double>(logits[static_cast<size_t>(id)]) - largest - std::log(sum);
}

// Megatron's per-token segments (detokenize_generations): the offsets slices for
// NullTokenizer, each id detokenized alone otherwise.
std::vector<std::string> segments_of(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  std::vector<std::string> segments;
  segments.reserve(ids.size());
  const bool null_tokenizer = dynamic_cast<const NullTokenizer*>(&tokenizer) != nullptr;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (null_tokenizer) {
      segments.push_back(std::to_string(ids[i]) + (i + 1 < ids.size() ? " " : ""));
    } else {
      segments.push_back(replace_invalid_utf8(tokenizer.detokenize(ids.subspan(i, 1))));
    }
  }
  return segments;
}

}  // namespace

GenerationResult generate(const SequenceScorer& scorer, int64_t max_position_embeddings,
                          Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options) {
  GenerationResult result;
  if (request.add_BOS) result.tokens.push_back(tokenizer.eod());
  tokenizer.tokenize(prompt, result.tokens);
  result.prompt_length = std::ssize(result.tokens);
  if (result.prompt_length == 0) {
    common::fail("the prompt has no tokens; an empty prompt needs add_BOS=true");
  }
  if (request.tokens_to_generate < 0) {
    common::fail("tokens_to_generate {} must be ≥ 0", request.tokens_to_generate);
  }
  const int64_t total = result.prompt_length + request.tokens_to_generate;
  if (total > max_position_embeddings) {
    common::fail(
        "Length of prompt + tokens_to_generate longer than allowed: {} prompt tokens + "
        "{} to generate > max_position_embeddings {}",
        result.prompt_length, request.tokens_to_generate, max_position_embeddings);
  }
  const int64_t vocab_size = tokenizer.vocab_size();

  const bool prevent_newline = request.prevent_newline_after_colon;
  const int32_t colon_id = prevent_newline ? first_id_of(tokenizer, ":", "\":\"") : -1;
  const int32_t newline_id = prevent_newline ? first_id_of(tokenizer, "\n", "\"\\n\"") : -1;

  // The draws' key (GenerationOptions).
  const uint64_t seed = request.random_seed >= 0
                            ? static_cast<uint64_t>(request.random_seed)
                            : common::splitmix64_at(options.server_seed, options.request_number);
  SamplingParameters parameters{
      .top_k = request.top_k, .top_p = request.top_p, .temperature = request.temperature};

  if (request.tokens_to_generate == 0) {
    // Megatron's score_and_return_on_first_stage: the prompt's log-probabilities only.
    SequenceScores scores = scorer(result.tokens);
    if (request.logprobs) result.logprobs = std::move(scores.next_token_logprobs);
  }
  for (int64_t context = result.prompt_length; context < total; ++context) {
    SequenceScores scores = scorer(result.tokens);
    std::vector<float>& logits = scores.last_logits;
    if (std::ssize(logits) < vocab_size) {
      common::fail("the model's logits cover {} ids, fewer than the tokenizer's {}", logits.size(),
                   vocab_size);
    }
    if (request.logprobs && context == result.prompt_length) {
      result.logprobs = std::move(scores.next_token_logprobs);
    }
    if (prevent_newline && result.tokens.back() == colon_id && newline_id < std::ssize(logits)) {
      logits[static_cast<size_t>(newline_id)] = kPreventedLogit;
    }
    const uint64_t step = static_cast<uint64_t>(context - result.prompt_length);
    const int32_t next = sample_token(logits, vocab_size, parameters,
                                      sampling_uniform(seed, options.prompt_index, step));
    if (parameters.top_p > 0.0 && request.top_p_decay > 0.0) {
      parameters.top_p *= request.top_p_decay;
      if (request.top_p_bound > 0.0)
        parameters.top_p = std::max(parameters.top_p, request.top_p_bound);
    }
    const int32_t previous = result.tokens.back();
    result.tokens.push_back(next);
    if (request.logprobs) result.logprobs.push_back(log_probability(logits, next));

    bool done = false;
    if (request.stop_on_double_eol) {
      done = next == kDoubleNewlineId || (next == kNewlineId && previous == kNewlineId);
    } else if (request.stop_on_eol) {
      done = next == kDoubleNewlineId || next == kNewlineId;
    } else {
      done = next == tokenizer.eod();
    }
    if (done) break;
  }

  result.text = replace_invalid_utf8(tokenizer.detokenize(result.tokens));
  result.segments = segments_of(tokenizer, result.tokens);
  return result;
}

GenerationResult generate(GptModel<float>& model, Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options) {
  const GptConfig& config = model.config();
  if (tokenizer.vocab_size() > config.vocab_size) {
    common::fail("the tokenizer's {} ids do not fit the model's vocabulary of {} (vocab_size)",
                 tokenizer.vocab_size(), config.vocab_size);
  }
  model.set_training(false);
  std::vector<int32_t> labels;
  const SequenceScorer scorer = [&](std::span<const int32_t> tokens) {
    const int64_t length = std::ssize(tokens);
    // Each position's label is the next token; the last position's (0) is not read.
    labels.assign(tokens.begin() + 1, tokens.end());
    labels.push_back(0);
    model.forward(tokens, labels, 1, length);
    const std::vector<float> losses = model.last_position_losses();
    SequenceScores scores;
    scores.next_token_logprobs.reserve(static_cast<size_t>(length - 1));
    for (int64_t i = 0; i + 1 < length; ++i) {
      scores.next_token_logprobs.push_back(-static_cast<double>(losses[static_cast<size_t>(i)]));
    }
    scores.last_logits = model.last_position_logits(0, length - 1);
    return scores;
  };
  return generate(scorer, config.max_position_embeddings, tokenizer, prompt, request, options);
}

}  // namespace backend
