// Text generation for one prompt, as Megatron-LM's text generation server runs it
// (megatron/inference/text_generation/{api.py, generation.py, tokenization.py}, Megatron core
// 0.12; facts only): generate_and_post_process → generate_tokens_probs_and_return_on_first_stage
// (or score_and_return_on_first_stage when tokens_to_generate is 0) → detokenize_generations.
//
//   1. Tokenize the prompt; add_BOS puts the tokenizer's end-of-document id first (Megatron's
//      _tokenize_prompts_and_batch prepends tokenizer.eod, there is no separate BOS).
//   2. prompt length + tokens_to_generate must be ≤ max_position_embeddings, else refused with
//      Megatron's ValueError text ("Length of prompt + tokens_to_generate longer than
//      allowed"); Megatron checks before generating and does not truncate.
//   3. Each step runs the model over the whole sequence so far and samples the next token from
//      the last position's logits (sampling.hpp). prevent_newline_after_colon first sets the
//      logit of tokenize("\n")[0] to −1e10 when the last token is tokenize(":")[0]. After each
//      step top_p ← top_p · top_p_decay (when both > 0), bounded below by top_p_bound (> 0).
//   4. Generation stops after tokens_to_generate tokens, or when the new token ends it, the
//      stopping token included in the result. Megatron's rule, in its order: with
//      stop_on_double_eol, id 628 ("\n\n" in GPT-2's vocabulary) or id 198 ("\n") after 198;
//      else with stop_on_eol, id 628 or 198; else the tokenizer's end-of-document id. The ids
//      198 and 628 are GPT-2's, hard-coded as in Megatron, whatever the tokenizer; and with
//      either eol rule the end-of-document id does not stop. The request's stop_token is beam
//      search's (Megatron's beam_search_and_post_process) and plays no part here.
//   5. The result, detokenize_generations': `text` is the detokenization of prompt + generated
//      ids, `segments` one string per id, and `logprobs` (when asked) the log-probability of
//      each id after the first, from the model's own logits over the padded vocabulary (log
//      softmax before temperature and filtering; at the last position of a step after the
//      colon rule, as Megatron gathers them).
//
// The rules live in one place, GenerationSequence: one prompt's state from its tokenization to
// its result, fed the logits of its positions by whoever runs the model. generate() below feeds
// it one full forward per token (no KV cache: step t runs all prompt + t tokens); the server's
// GenerationScheduler (generation_scheduler.hpp) feeds many sequences from one batched KV-cache
// step (docs/serving.md).
//
// Differences from Megatron, by design: the draws come from our counter-based generator
// (sampling.hpp), keyed as GenerationOptions says, not torch's stream; text and segments
// replace ill-formed UTF-8 by U+FFFD (Python's decode(errors="replace"), which Megatron's GPT-2
// tokenizer applies) for every tokenizer; segments are each id detokenized alone, except for
// NullTokenizer where they are Megatron's offsets slices ("12 " with the separating space).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/data/tokenizer.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/serve/generate_request.hpp"

namespace backend {

// Where the draws of one prompt come from. With the request's random_seed ≥ 0 the key is
// (random_seed, prompt_index, step), so the same seed gives the same tokens as Megatron's
// manual_seed does (though not Megatron's tokens); with −1 it is (splitmix64 of
// (server_seed, request_number), prompt_index, step): the server's own sequence.
struct GenerationOptions {
  uint64_t server_seed = 0;
  uint64_t request_number = 0;
  uint64_t prompt_index = 0;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // prompt (with BOS when asked) + generated
  int64_t prompt_length = 0;    // of tokens
  std::string text;
  std::vector<std::string> segments;  // one per token
  std::vector<double> logprobs;       // tokens.size() − 1 values when asked, else empty
};

// One prompt's generation, Megatron's rules above as a state machine over the logits of its
// positions. The constructor tokenizes (add_BOS) and applies the refusals (the length rule
// against `max_length`, an empty prompt, tokens_to_generate < 0, the colon rule's tokenizer
// needs), with common::Error. Then, in any order that respects causality:
//   - accept_prompt_logits(i, logits of position i) for i in [0, prompt_length − 1) when
//     prompt_logits_wanted() (logprobs asked): the log-probability of prompt token i + 1;
//   - accept_logits(logits of the last token's position) while !finished(): samples the next
//     token (colon rule, seed keying, top_p decay) and applies the stop rules.
// A scoring request (tokens_to_generate 0) is finished from the start and needs the prompt's
// logits only. result() detokenizes. The tokenizer must outlive the sequence; the sequence
// calls it in the constructor and in result() only.
class GenerationSequence {
 public:
  GenerationSequence(Tokenizer& tokenizer, int64_t max_length, std::string_view prompt,
                     const GenerateRequest& request, const GenerationOptions& options);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t prompt_length() const { return prompt_length_; }
  // prompt_length + tokens_to_generate: the most tokens the sequence can reach.
  int64_t length_limit() const { return length_limit_; }
  bool prompt_logits_wanted() const { return request_.logprobs; }
  bool finished() const { return finished_; }

  // Position `position` ∈ [0, prompt_length − 1)'s logits over the padded vocabulary: the
  // log-probability of token position + 1. Positions come in increasing order, each once.
  void accept_prompt_logits(int64_t position, std::span<const float> logits);
  // The same log-probabilities computed elsewhere (a SequenceScorer), all prompt_length − 1.
  void accept_prompt_logprobs(std::vector<double> logprobs);
  // The logits at the last token's position (the colon rule may change them): appends the next
  // token. common::Error for logits smaller than the tokenizer's vocabulary and for sampling
  // parameters sampling.hpp refuses.
  void accept_logits(std::span<float> logits);

  GenerationResult result() const;

 private:
  Tokenizer* tokenizer_;
  GenerateRequest request_;
  std::vector<int32_t> tokens_;
  std::vector<double> logprobs_;
  int64_t prompt_length_ = 0;
  int64_t length_limit_ = 0;
  int64_t vocab_size_ = 0;
  int32_t colon_id_ = -1;
  int32_t newline_id_ = -1;
  uint64_t seed_ = 0;
  uint64_t prompt_index_ = 0;
  uint64_t step_ = 0;
  double top_p_ = 0.0;
  bool finished_ = false;
};

// log_softmax(logits)[id], in fp64: a token's log-probability as `logprobs` reports it.
double token_log_probability(std::span<const float> logits, int32_t id);

// One full forward of a sequence, what generation needs of a model: the log-probability of
// each next token (tokens.size() − 1 values: log p(tokens[i+1] | tokens[0..i])) and the last
// position's logits over the padded vocabulary.
struct SequenceScores {
  std::vector<double> next_token_logprobs;
  std::vector<float> last_logits;
};
using SequenceScorer = std::function<SequenceScores(std::span<const int32_t> tokens)>;

// Generation with any scorer (tests script one): `max_position_embeddings` bounds prompt +
// generated tokens. common::Error for a refused request (the length rule, an empty prompt, a
// tokenizer that cannot tokenize ":" or "\n" under prevent_newline_after_colon, sampling
// parameters sampling.hpp refuses) and for logits smaller than the tokenizer's vocabulary.
GenerationResult generate(const SequenceScorer& scorer, int64_t max_position_embeddings,
                          Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options);

// Generation with a whole model (no tensor or pipeline parallelism) on any device. Puts the
// model in evaluation mode (dropout off), as Megatron's server runs it, and leaves it there.
// The tokenizer's vocabulary must fit the model's (vocab_size ≤ config().vocab_size).
GenerationResult generate(GptModel<float>& model, Tokenizer& tokenizer, std::string_view prompt,
                          const GenerateRequest& request, const GenerationOptions& options);

}  // namespace backend
