// generate() against Megatron's generation rules (generation.hpp): greedy decoding of a model
// equals the argmax of a full forward of the same model at every step, logprobs equal its log
// softmax, and the stop rules, the colon rule, add_BOS, the length refusal, the segments and the
// seeded draws, with a scripted scorer whose next token the test chooses.
#include "backend/serve/generation.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt2_test_tokenizer.hpp"
#include "backend/data/null_tokenizer.hpp"
#include "tests/backend/serve/small_generation_model.hpp"

using namespace backend;

namespace {

constexpr int64_t kGpt2PaddedVocabulary = 50304;
constexpr int32_t kGpt2Eod = 50256;

GenerateRequest greedy_request(int64_t tokens_to_generate) {
  GenerateRequest request;
  request.tokens_to_generate = tokens_to_generate;
  request.top_k = 1;
  return request;
}

// A scorer whose largest logit at step t (t tokens generated so far) is script[t] (10 against
// 0 elsewhere); the prompt's log-probabilities are −1 − i.
SequenceScorer scripted(std::vector<int32_t> script, int64_t prompt_length,
                        int64_t padded_vocabulary = kGpt2PaddedVocabulary) {
  return [=](std::span<const int32_t> tokens) {
    SequenceScores scores;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      scores.next_token_logprobs.push_back(-1.0 - static_cast<double>(i));
    }
    scores.last_logits.assign(static_cast<size_t>(padded_vocabulary), 0.0f);
    const size_t step = tokens.size() - static_cast<size_t>(prompt_length);
    if (step < script.size()) scores.last_logits[static_cast<size_t>(script[step])] = 10.0f;
    return scores;
  };
}

std::vector<int32_t> generated(const GenerationResult& result) {
  return {result.tokens.begin() + result.prompt_length, result.tokens.end()};
}

GptConfig generation_model_config() { return test_support::small_generation_config(16); }

}  // namespace

TEST_CASE("greedy generation gives the argmax of a full forward of the model at every step") {
  const GptConfig config = generation_model_config();
  GptModel<float> model(config);
  model.init_parameters(5);
  GptModel<float> reference(config);  // the training model, same parameters
  reference.init_parameters(5);
  NullTokenizer tokenizer(63);
  GenerateRequest request = greedy_request(10);
  request.logprobs = true;
  // The eod would end the run at the first step whose argmax is a padding row (clamped to the
  // last id, the eod); with stop_on_eol only GPT-2's ids 198 and 628, outside this
  // vocabulary, would stop, so all 10 steps run.
  request.stop_on_eol = true;
  const GenerationResult result = generate(model, tokenizer, "4 8 15 16", request, {});
  REQUIRE(result.prompt_length == 4);
  const int64_t length = std::ssize(result.tokens);
  REQUIRE(length == result.prompt_length + 10);
  int steps_in_padding = 0;
  for (int64_t context = result.prompt_length; context < length; ++context) {
    CAPTURE(context);
    const std::vector<int32_t> tokens(result.tokens.begin(), result.tokens.begin() + context);
    const std::vector<int32_t> labels(tokens.size(), 0);
    reference.forward(tokens, labels, 1, context);
    const int32_t argmax = reference.last_position_argmax()[static_cast<size_t>(context - 1)];
    // Megatron clamps an id of the padded vocabulary's extra rows to the last real id.
    CHECK(result.tokens[static_cast<size_t>(context)] == std::min<int32_t>(argmax, 63));
    steps_in_padding += argmax >= 64;
  }
  // Both kinds of step happened: an argmax among the real ids and one in the padding rows.
  CHECK(steps_in_padding > 0);
  CHECK(steps_in_padding < 10);
  // logprobs: log softmax of one full forward of the whole sequence at each next token.
  const std::vector<int32_t> labels(result.tokens.begin() + 1, result.tokens.end());
  std::vector<int32_t> shifted = labels;
  shifted.push_back(0);
  reference.forward(result.tokens, shifted, 1, length);
  const std::vector<float> losses = reference.last_position_losses();
  REQUIRE(std::ssize(result.logprobs) == length - 1);
  for (int64_t i = 0; i + 1 < length; ++i) {
    CAPTURE(i);
    CHECK(result.logprobs[static_cast<size_t>(i)] ==
          doctest::Approx(-static_cast<double>(losses[static_cast<size_t>(i)])).epsilon(1e-5));
  }
  // Megatron's NullTokenizer segments: the detokenized text cut at each id's offset.
  REQUIRE(std::ssize(result.segments) == length);
  CHECK(result.segments.front() == "4 ");
  std::string joined;
  for (const std::string& segment : result.segments) joined += segment;
  CHECK(joined == result.text);
  CHECK(result.text.starts_with("4 8 15 16 "));
}

TEST_CASE("generation stops on the end-of-document id, the stop token included") {
  auto tokenizer = test_support::gpt2_tokenizer();
  const std::vector<int32_t> prompt = tokenizer->tokenize("Hello world");
  const int64_t n = std::ssize(prompt);
  const GenerationResult stopped = generate(scripted({5, kGpt2Eod, 7}, n), 100, *tokenizer,
                                            "Hello world", greedy_request(3), {});
  CHECK(generated(stopped) == std::vector<int32_t>{5, kGpt2Eod});
  CHECK(stopped.text.ends_with("<|endoftext|>"));
  CHECK(stopped.logprobs.empty());  // not asked
  const GenerationResult full =
      generate(scripted({5, 6, 7, 8}, n), 100, *tokenizer, "Hello world", greedy_request(3), {});
  CHECK(generated(full) == std::vector<int32_t>{5, 6, 7});
  REQUIRE(std::ssize(full.segments) == n + 3);
  CHECK(full.segments[0] == "Hello");
  CHECK(full.segments[1] == " world");
}

TEST_CASE("stop_on_eol and stop_on_double_eol use GPT-2's ids 198 and 628, not the eod") {
  auto tokenizer = test_support::gpt2_tokenizer();
  REQUIRE(tokenizer->tokenize("\n") == std::vector<int32_t>{198});
  REQUIRE(tokenizer->tokenize("\n\n") == std::vector<int32_t>{628});
  const int64_t n = std::ssize(tokenizer->tokenize("Hi"));
  GenerateRequest eol = greedy_request(5);
  eol.stop_on_eol = true;
  CHECK(generated(generate(scripted({5, 198, 7}, n), 100, *tokenizer, "Hi", eol, {})) ==
        std::vector<int32_t>{5, 198});
  CHECK(generated(generate(scripted({628, 7}, n), 100, *tokenizer, "Hi", eol, {})) ==
        std::vector<int32_t>{628});
  // With an eol rule the end of document does not stop (Megatron's elif chain).
  CHECK(generated(generate(scripted({kGpt2Eod, 9, 198}, n), 100, *tokenizer, "Hi", eol, {})) ==
        std::vector<int32_t>{kGpt2Eod, 9, 198});

  GenerateRequest double_eol = greedy_request(6);
  double_eol.stop_on_double_eol = true;
  double_eol.stop_on_eol = true;  // double wins
  CHECK(generated(generate(scripted({198, 5, 198, 198, 9}, n), 100, *tokenizer, "Hi", double_eol,
                           {})) == std::vector<int32_t>{198, 5, 198, 198});
  CHECK(generated(generate(scripted({5, 628, 9}, n), 100, *tokenizer, "Hi", double_eol, {})) ==
        std::vector<int32_t>{5, 628});
  // The token before the first generated one is the prompt's last.
  const int64_t m = std::ssize(tokenizer->tokenize("Hi\n"));
  CHECK(generated(generate(scripted({198, 5}, m), 100, *tokenizer, "Hi\n", double_eol, {})) ==
        std::vector<int32_t>{198});
  double_eol.tokens_to_generate = 2;
  CHECK(generated(generate(scripted({kGpt2Eod, 5}, n), 100, *tokenizer, "Hi", double_eol, {})) ==
        std::vector<int32_t>{kGpt2Eod, 5});
}

TEST_CASE("prevent_newline_after_colon removes \"\\n\" after \":\" from the logits") {
  auto tokenizer = test_support::gpt2_tokenizer();
  const std::vector<int32_t> prompt = tokenizer->tokenize("Answer:");
  REQUIRE(prompt.back() == tokenizer->tokenize(":").front());
  const int64_t n = std::ssize(prompt);
  // "\n" is the largest logit (10), id 5 the next (5).
  const SequenceScorer scorer = [&](std::span<const int32_t> tokens) {
    SequenceScores scores;
    scores.next_token_logprobs.assign(tokens.size() - 1, -1.0);
    scores.last_logits.assign(kGpt2PaddedVocabulary, 0.0f);
    scores.last_logits[198] = 10.0f;
    scores.last_logits[5] = 5.0f;
    return scores;
  };
  GenerateRequest request = greedy_request(2);
  request.logprobs = true;
  CHECK(generated(generate(scorer, 100, *tokenizer, "Answer:", request, {})) ==
        std::vector<int32_t>{198, 198});
  request.prevent_newline_after_colon = true;
  const GenerationResult result = generate(scorer, 100, *tokenizer, "Answer:", request, {});
  // Only right after the colon: the second step follows id 5.
  CHECK(generated(result) == std::vector<int32_t>{5, 198});
  // The logprob of 5 is taken from the modified logits (198 at −1e10), as Megatron gathers it.
  const double rest = std::exp(5.0) + static_cast<double>(kGpt2PaddedVocabulary - 2);
  REQUIRE(std::ssize(result.logprobs) == n + 1);
  CHECK(result.logprobs[static_cast<size_t>(n - 1)] == doctest::Approx(5.0 - std::log(rest)));
  // The prompt's log-probabilities come from the scorer.
  CHECK(result.logprobs.front() == -1.0);

  NullTokenizer null_tokenizer(63);
  CHECK_THROWS_WITH_AS(generate(scripted({1}, 1, 64), 100, null_tokenizer, "3", request, {}),
                       doctest::Contains("prevent_newline_after_colon needs the tokenizer"),
                       common::Error);
}

TEST_CASE("add_BOS, the length limit, empty prompts and scoring only") {
  auto tokenizer = test_support::gpt2_tokenizer();
  const int64_t n = std::ssize(tokenizer->tokenize("Hello world"));  // 2
  GenerateRequest bos = greedy_request(1);
  bos.add_BOS = true;
  const GenerationResult with_bos =
      generate(scripted({5}, n + 1), 100, *tokenizer, "Hello world", bos, {});
  CHECK(with_bos.tokens.front() == kGpt2Eod);
  CHECK(with_bos.prompt_length == n + 1);
  const GenerationResult empty = generate(scripted({5}, 1), 100, *tokenizer, "", bos, {});
  CHECK(empty.tokens == std::vector<int32_t>{kGpt2Eod, 5});
  CHECK_THROWS_WITH_AS(generate(scripted({5}, 0), 100, *tokenizer, "", greedy_request(1), {}),
                       doctest::Contains("needs add_BOS=true"), common::Error);

  // prompt + tokens_to_generate ≤ max_position_embeddings, checked before generating.
  CHECK(
      std::ssize(generate(scripted({}, n), n + 3, *tokenizer, "Hello world", greedy_request(3), {})
                     .tokens) == n + 3);
  CHECK_THROWS_WITH_AS(
      generate(scripted({}, n), n + 3, *tokenizer, "Hello world", greedy_request(4), {}),
      doctest::Contains("Length of prompt + tokens_to_generate longer than "
                        "allowed"),
      common::Error);
  CHECK_THROWS_AS(
      generate(scripted({}, n), n - 1, *tokenizer, "Hello world", greedy_request(0), {}),
      common::Error);

  GenerateRequest score = greedy_request(0);
  score.logprobs = true;
  const GenerationResult scored =
      generate(scripted({}, n), 100, *tokenizer, "Hello world", score, {});
  CHECK(scored.tokens == tokenizer->tokenize("Hello world"));
  CHECK(scored.logprobs == std::vector<double>{-1.0});
  CHECK(scored.text == "Hello world");

  // A model whose logits do not cover the tokenizer's ids.
  CHECK_THROWS_AS(
      generate(scripted({}, n, 100), 100, *tokenizer, "Hello world", greedy_request(1), {}),
      common::Error);
}

TEST_CASE("sampled generation is reproducible from its seed") {
  NullTokenizer tokenizer(63);
  // Uniform logits over the 63 text ids: every draw is a fresh choice.
  const SequenceScorer uniform = [](std::span<const int32_t> tokens) {
    SequenceScores scores;
    scores.next_token_logprobs.assign(tokens.size() - 1, 0.0);
    scores.last_logits.assign(64, 0.0f);
    scores.last_logits[63] = -1e10f;  // never the eod, so all 12 tokens come
    return scores;
  };
  GenerateRequest request;
  request.tokens_to_generate = 12;
  request.random_seed = 42;
  auto run = [&](const GenerateRequest& r, GenerationOptions options) {
    return generated(generate(uniform, 100, tokenizer, "1", r, options));
  };
  const std::vector<int32_t> first = run(request, {});
  CHECK(first.size() == 12);
  CHECK(run(request, {}) == first);
  // An explicit seed ignores the server's own sequence.
  CHECK(run(request, {.server_seed = 9, .request_number = 3, .prompt_index = 0}) == first);
  // Another prompt of the request, another seed, or the server's sequence: other draws.
  CHECK(run(request, {.server_seed = 0, .request_number = 0, .prompt_index = 1}) != first);
  GenerateRequest other = request;
  other.random_seed = 43;
  CHECK(run(other, {}) != first);
  GenerateRequest server = request;
  server.random_seed = -1;
  const std::vector<int32_t> a = run(server, {.server_seed = 1, .request_number = 0});
  CHECK(run(server, {.server_seed = 1, .request_number = 0}) == a);
  CHECK(run(server, {.server_seed = 1, .request_number = 1}) != a);
}

TEST_CASE("top_p decays after each sampled token, as Megatron's loop does, and top_p_bound holds it up") {
  NullTokenizer tokenizer(63);
  // Two candidates: id 5 with probability 0.6 and id 7 with 0.4. top_p 0.9 keeps both; top_p
  // 0.45 (0.9 after one decay by 0.5) keeps 5 alone, the token that first passes it.
  const SequenceScorer two_candidates = [](std::span<const int32_t> tokens) {
    SequenceScores scores;
    scores.next_token_logprobs.assign(tokens.size() - 1, 0.0);
    scores.last_logits.assign(64, -1e10f);
    scores.last_logits[5] = std::log(0.6f);
    scores.last_logits[7] = std::log(0.4f);
    return scores;
  };
  GenerateRequest request;
  request.tokens_to_generate = 6;
  request.top_p = 0.9;
  request.top_p_decay = 0.5;
  int first_step_sevens = 0, later_sevens = 0, later_sevens_bounded = 0;
  for (int64_t seed = 0; seed < 100; ++seed) {
    CAPTURE(seed);
    request.random_seed = seed;
    request.top_p_bound = 0.0;
    const std::vector<int32_t> decayed =
        generated(generate(two_candidates, 100, tokenizer, "1", request, {}));
    REQUIRE(decayed.size() == 6);
    first_step_sevens += decayed[0] == 7;
    for (size_t step = 1; step < decayed.size(); ++step) later_sevens += decayed[step] == 7;
    request.top_p_bound = 0.7;  // 0.45 raised to 0.7: both candidates stay
    const std::vector<int32_t> bounded =
        generated(generate(two_candidates, 100, tokenizer, "1", request, {}));
    REQUIRE(bounded.size() == 6);
    CHECK(bounded[0] == decayed[0]);  // the same seed, the same first draw at top_p 0.9
    for (size_t step = 1; step < bounded.size(); ++step) later_sevens_bounded += bounded[step] == 7;
  }
  // The first token is drawn at the request's top_p (the decay follows each sample): about 40
  // of 100 draws give 7. Every later draw at 0.45 gives 5; at the bound, about 200 of 500 give 7.
  CHECK(first_step_sevens > 20);
  CHECK(first_step_sevens < 60);
  CHECK(later_sevens == 0);
  CHECK(later_sevens_bounded > 120);
  CHECK(later_sevens_bounded < 280);
}
