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
// This is the generation core, below the HTTP layer: one prompt at a time and no KV cache, so
// step t runs a full forward of all prompt + t tokens (quadratic in the length). The KV cache,
// batching of prompts and the server come with the serving issue (docs/serving.md).
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
