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

double token_log_probability(std::span<const float> logits, int32_t id) {
  const double largest = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float logit : logits) sum += std::exp(static_cast<double>(logit) - largest);
  return static_cast<double>(logits[static_cast<size_t>(id)]) - largest - std::log(sum);
}

GenerationSequence::GenerationSequence(Tokenizer& tokenizer, int64_t max_length,
                                       std::string_view prompt, const GenerateRequest& request,
                                       const GenerationOptions& options)
    : tokenizer_(&tokenizer), request_(request), prompt_index_(options.prompt_index) {
  request_.prompts.clear();  // the prompt is in tokens_; the other prompts are not ours
  if (request.add_BOS) tokens_.push_back(tokenizer.eod());
  tokenizer.tokenize(prompt, tokens_);
  prompt_length_ = std::ssize(tokens_);
  if (prompt_length_ == 0) {
    common::fail("the prompt has no tokens; an empty prompt needs add_BOS=true");
  }
  if (request.tokens_to_generate < 0) {
    common::fail("tokens_to_generate {} must be ≥ 0", request.tokens_to_generate);
  }
  length_limit_ = prompt_length_ + request.tokens_to_generate;
  if (length_limit_ > max_length) {
    common::fail(
        "Length of prompt + tokens_to_generate longer than allowed: {} prompt tokens + "
        "{} to generate > max_position_embeddings {}",
        prompt_length_, request.tokens_to_generate, max_length);
  }
  vocab_size_ = tokenizer.vocab_size();
  if (request.prevent_newline_after_colon) {
    colon_id_ = first_id_of(tokenizer, ":", "\":\"");
    newline_id_ = first_id_of(tokenizer, "\n", "\"\\n\"");
  }
  // The draws' key (GenerationOptions).
  seed_ = request.random_seed >= 0
              ? static_cast<uint64_t>(request.random_seed)
              : common::splitmix64_at(options.server_seed, options.request_number);
  top_p_ = request.top_p;
  finished_ = request.tokens_to_generate == 0;  // Megatron's scoring: the prompt only
}

void GenerationSequence::accept_prompt_logits(int64_t position, std::span<const float> logits) {
  if (!request_.logprobs) return;
  if (position != std::ssize(logprobs_) || position + 1 >= prompt_length_) {
    common::fail("internal: prompt logits of position {} after {} of a {}-token prompt", position,
                 logprobs_.size(), prompt_length_);
  }
  if (std::ssize(logits) < vocab_size_) {
    common::fail("the model's logits cover {} ids, fewer than the tokenizer's {}", logits.size(),
                 vocab_size_);
  }
  logprobs_.push_back(token_log_probability(logits, tokens_[static_cast<size_t>(position + 1)]));
}

void GenerationSequence::accept_prompt_logprobs(std::vector<double> logprobs) {
  if (request_.logprobs) logprobs_ = std::move(logprobs);
}

void GenerationSequence::accept_logits(std::span<float> logits) {
  if (finished_) common::fail("internal: logits for a finished sequence");
  if (std::ssize(logits) < vocab_size_) {
    common::fail("the model's logits cover {} ids, fewer than the tokenizer's {}", logits.size(),
                 vocab_size_);
  }
  if (request_.prevent_newline_after_colon && tokens_.back() == colon_id_ &&
      newline_id_ < std::ssize(logits)) {
    logits[static_cast<size_t>(newline_id_)] = kPreventedLogit;
  }
  const SamplingParameters parameters{
      .top_k = request_.top_k, .top_p = top_p_, .temperature = request_.temperature};
  const int32_t next =
      sample_token(logits, vocab_size_, parameters, sampling_uniform(seed_, prompt_index_, step_));
  ++step_;
  if (top_p_ > 0.0 && request_.top_p_decay > 0.0) {
    top_p_ *= request_.top_p_decay;
    if (request_.top_p_bound > 0.0) top_p_ = std::max(top_p_, request_.top_p_bound);
  }
  const int32_t previous = tokens_.back();
  tokens_.push_back(next);
  if (request_.logprobs) logprobs_.push_back(token_log_probability(logits, next));

  if (request_.stop_on_double_eol) {
    finished_ = next == kDoubleNewlineId || (next == kNewlineId && previous == kNewlineId);
  } else if (request_.stop_on_eol) {
    finished_ = next == kDoubleNewlineId || next == kNewlineId;
  } else {
    finished_ = next == tokenizer_->eod();
  }
  if (std::ssize(tokens_) >= length_limit_) finished_ = true;
}

GenerationResult GenerationSequence::result() const {
  GenerationResult result;
  result.tokens = tokens_;
  result.prompt_length = prompt_length_;
  result.logprobs = logprobs_;
  result.text = replace_invalid_utf8(tokenizer_->detokenize(tokens_));
  result.segments = segments_of(*tokenizer_, tokens_);
  return result;
}

GenerationResult generate(const SequenceScorer& scorer, int64_t max_position_embeddings,
                          Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options) {
  GenerationSequence sequence(tokenizer, max_position_embeddings, prompt, request, options);
  if (sequence.finished()) {
    // Megatron's score_and_return_on_first_stage: the prompt's log-probabilities only.
    sequence.accept_prompt_logprobs(scorer(sequence.tokens()).next_token_logprobs);
  }
  bool first = true;
  while (!sequence.finished()) {
    SequenceScores scores = scorer(sequence.tokens());
    if (first) sequence.accept_prompt_logprobs(std::move(scores.next_token_logprobs));
    first = false;
    sequence.accept_logits(scores.last_logits);
  }
  return sequence.result();
}

GenerationResult generate(GptModel<float>& model, Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options) {
  const GptConfig& config = model.config();
  if (tokenizer.vocab_size() > config.vocab_size) {
    common::fail("the tokenizer's {} ids do not fit the model's vocabulary of {} (vocab_size)",
                 tokenizer.vocab_size(), config.vocab_size);
  }
  model.set_training(false);
  GenerationSequence sequence(tokenizer, config.max_position_embeddings, prompt, request,
                              options);
  std::vector<int32_t> labels;
  auto forward = [&] {
    const std::vector<int32_t>& tokens = sequence.tokens();
    labels.assign(tokens.size(), 0);  // the losses are not read
    model.forward(tokens, labels, 1, std::ssize(tokens));
  };
  // The prompt's log-probabilities from its positions' logits, as the server's batched steps
  // compute them (GenerationSequence::accept_prompt_logits), so that both give the same values.
  if (sequence.prompt_logits_wanted()) {
    forward();
    for (int64_t position = 0; position + 1 < sequence.prompt_length(); ++position) {
      sequence.accept_prompt_logits(position, model.last_position_logits(0, position));
    }
  }
  bool forwarded = sequence.prompt_logits_wanted();
  while (!sequence.finished()) {
    if (!forwarded) forward();
    forwarded = false;
    std::vector<float> logits =
        model.last_position_logits(0, std::ssize(sequence.tokens()) - 1);
    sequence.accept_logits(logits);
  }
  return sequence.result();
}

}  // namespace backend
