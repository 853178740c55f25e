// GptDecoder (KV-cache incremental decoding) against GptModel's full forward in evaluation mode:
// a GPT-2-style model (learned positions, LayerNorm, GELU, biases, tied) and a Llama-style one
// (RoPE on half of each head, RMSNorm, SwiGLU, no biases, grouped-query attention, untied
// output layer). Every row's logits equal last_position_logits of the slot's whole sequence at
// the row's position: a prompt prefilled in one step then decoded token by token; several slots
// interleaved in one step (one prefilling while others decode, rows out of slot order); a slot
// reused from position 0; greedy decoding; rows without logits; refused inputs and that a
// refused step changes nothing.
#include "backend/model/gpt_decoder.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/common/error.hpp"

namespace {

using backend::DecodeRow;
using backend::GptConfig;
using backend::GptDecoder;
using backend::GptModel;

GptConfig gpt2_config() {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.ffn_hidden_size = 64;
  config.vocab_size = 50;
  config.padded_vocab_size = backend::padded_vocab_size(50, 16, 1);  // 64
  config.max_position_embeddings = 24;
  config.init_method_std = 0.2;  // sharper attention than 0.02, so a wrong key shows
  return config;
}

GptConfig llama_config() {
  GptConfig config = gpt2_config();
  config.num_query_groups = 2;
  config.ffn_hidden_size = 48;
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  config.rotary_percent = 0.5;
  config.rotary_base = 500;
  config.normalization = backend::Normalization::rms_norm;
  config.swiglu = true;
  config.add_bias_linear = false;
  config.share_embeddings_and_output_weights = false;
  return config;
}

GptModel<float> make_model(const GptConfig& config) {
  GptModel<float> model(config);
  model.init_parameters(7);
  model.set_training(false);
  return model;
}

// The full forward's logits of `tokens` at `position`.
std::vector<float> full_logits(GptModel<float>& model, const std::vector<int32_t>& tokens,
                               int64_t position) {
  const auto length = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> labels(tokens.size(), 0);
  model.forward(tokens, labels, 1, length);
  return model.last_position_logits(0, position);
}

void check_close(const float* actual, const std::vector<float>& expected, const std::string& what) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double difference = std::abs(double{actual[i]} - double{expected[i]});
    worst = std::max(worst, difference / (1.0 + std::abs(double{expected[i]})));
  }
  INFO(what << ": worst difference " << worst);
  CHECK(worst <= 2e-5);
}

std::vector<int32_t> sequence(int64_t length, int32_t seed, int32_t vocabulary) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < length; ++i) {
    tokens.push_back(static_cast<int32_t>((seed * 31 + i * 17 + i * i * 7) % vocabulary));
  }
  return tokens;
}

// Runs `rows` through the decoder (logits for rows with the flag) and checks each such row
// against the full forward of its slot's sequence `sequences[slot]` (the tokens up to the row's
// position).
void step_and_check(GptDecoder& decoder, GptModel<float>& model, const std::vector<DecodeRow>& rows,
                    const std::vector<std::vector<int32_t>>& sequences, const std::string& what) {
  const int64_t vocabulary = decoder.padded_vocab_size();
  const auto with_logits = std::count_if(rows.begin(), rows.end(),
                                         [](const DecodeRow& row) { return row.logits; });
  std::vector<float> logits(static_cast<size_t>(with_logits * vocabulary), NAN);
  decoder.step(rows, logits);
  int64_t k = 0;
  for (const DecodeRow& row : rows) {
    if (!row.logits) continue;
    const auto& tokens = sequences[static_cast<size_t>(row.slot)];
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + row.position + 1);
    check_close(logits.data() + k * vocabulary, full_logits(model, prefix, row.position),
                what + ", slot " + std::to_string(row.slot) + " position " +
                    std::to_string(row.position));
    ++k;
  }
}

int32_t argmax(const float* logits, int64_t count) {
  return static_cast<int32_t>(std::max_element(logits, logits + count) - logits);
}

}  // namespace

TEST_CASE("GptDecoder: a prefill then token-by-token decoding equal the full forward") {
  for (const bool llama : {false, true}) {
    const GptConfig config = llama ? llama_config() : gpt2_config();
    const std::string name = llama ? "llama-style" : "gpt2-style";
    GptModel<float> model = make_model(config);
    GptDecoder decoder(model, 2, config.max_position_embeddings, 8);
    CHECK(decoder.padded_vocab_size() == config.padded_vocab_size);
    CHECK(decoder.cache_bytes() == 2 * config.num_layers * 2 * config.max_position_embeddings *
                                       config.query_groups() * config.head_dim() * 4);
    const auto tokens = sequence(config.max_position_embeddings, 3, 50);
    const std::vector<std::vector<int32_t>> sequences{{}, tokens};
    std::vector<DecodeRow> prefill;
    for (int32_t p = 0; p < 6; ++p) prefill.push_back({tokens[static_cast<size_t>(p)], p, 1, true});
    step_and_check(decoder, model, prefill, sequences, name + " prefill");
    for (int32_t p = 6; p < config.max_position_embeddings; ++p) {
      step_and_check(decoder, model, {{tokens[static_cast<size_t>(p)], p, 1, true}}, sequences,
                     name + " decode");
    }
  }
}

TEST_CASE("GptDecoder: slots interleaved in one step, and a slot reused, equal their forwards") {
  for (const bool llama : {false, true}) {
    const GptConfig config = llama ? llama_config() : gpt2_config();
    const std::string name = llama ? "llama-style" : "gpt2-style";
    GptModel<float> model = make_model(config);
    GptDecoder decoder(model, 3, 16, 8);
    std::vector<std::vector<int32_t>> sequences{sequence(16, 1, 50), sequence(16, 2, 50),
                                                sequence(16, 5, 50)};
    auto row = [&](int32_t slot, int32_t position, bool logits = true) {
      return DecodeRow{sequences[static_cast<size_t>(slot)][static_cast<size_t>(position)],
                       position, slot, logits};
    };
    step_and_check(decoder, model, {row(0, 0), row(0, 1), row(0, 2), row(0, 3)}, sequences,
                   name + " step 1");
    // Slot 0 decodes while slot 1 prefills three positions and slot 2 starts.
    step_and_check(decoder, model, {row(1, 0), row(0, 4), row(1, 1), row(2, 0), row(1, 2)},
                   sequences, name + " step 2");
    // Rows out of slot order.
    step_and_check(decoder, model, {row(2, 1), row(1, 3), row(0, 5)}, sequences, name + " step 3");
    // Slot 0 starts another sequence at position 0 while the others go on.
    sequences[0] = sequence(16, 9, 50);
    step_and_check(decoder, model, {row(1, 4), row(0, 0), row(0, 1), row(0, 2), row(2, 2)},
                   sequences, name + " slot 0 reused");
    step_and_check(decoder, model, {row(0, 3), row(2, 3)}, sequences, name + " after reuse");
  }
}

TEST_CASE("GptDecoder: greedy decoding with the cache equals greedy decoding by full forwards") {
  for (const bool llama : {false, true}) {
    const GptConfig config = llama ? llama_config() : gpt2_config();
    GptModel<float> model = make_model(config);
    const int64_t vocabulary = config.padded_vocab_size;
    const std::vector<int32_t> prompt{5, 17, 42};
    const int64_t generated = 12;

    std::vector<int32_t> by_forward = prompt;
    for (int64_t i = 0; i < generated; ++i) {
      const auto logits = full_logits(model, by_forward,
                                      static_cast<int64_t>(by_forward.size()) - 1);
      by_forward.push_back(argmax(logits.data(), config.vocab_size));
    }

    GptDecoder decoder(model, 1, 16, 4);
    std::vector<float> logits(static_cast<size_t>(vocabulary));
    std::vector<DecodeRow> rows;
    for (int32_t p = 0; p < 3; ++p) {
      rows.push_back({prompt[static_cast<size_t>(p)], p, 0, p == 2});
    }
    decoder.step(rows, logits);
    std::vector<int32_t> by_cache = prompt;
    for (int64_t i = 0; i < generated; ++i) {
      by_cache.push_back(argmax(logits.data(), config.vocab_size));
      if (i + 1 == generated) break;
      const DecodeRow next{by_cache.back(), static_cast<int32_t>(by_cache.size()) - 1, 0, true};
      decoder.step({&next, 1}, logits);
    }
    CHECK(by_cache == by_forward);
  }
}

TEST_CASE("GptDecoder: rows without logits give none, and bad arguments are refused") {
  const GptConfig config = gpt2_config();
  GptModel<float> model = make_model(config);
  const int64_t vocabulary = config.padded_vocab_size;
  const auto tokens = sequence(8, 4, 50);
  const std::vector<std::vector<int32_t>> sequences{tokens, tokens};

  CHECK_THROWS_AS(GptDecoder(model, 0, 8, 4), common::Error);
  CHECK_THROWS_AS(GptDecoder(model, 1, 0, 4), common::Error);
  CHECK_THROWS_AS(GptDecoder(model, 1, 8, 0), common::Error);
  CHECK_THROWS_AS(GptDecoder(model, 1, config.max_position_embeddings + 1, 4),
                  common::Error);

  GptDecoder decoder(model, 2, 8, 4);
  // Only rows 0 and 2 of the prefill ask for logits.
  step_and_check(decoder, model,
                 {{tokens[0], 0, 0, true}, {tokens[1], 1, 0, false}, {tokens[2], 2, 0, true}},
                 sequences, "some rows without logits");
  // No row with logits: an empty span.
  decoder.step(std::vector<DecodeRow>{{tokens[3], 3, 0, false}}, {});

  std::vector<float> one(static_cast<size_t>(vocabulary));
  auto refused = [&](std::vector<DecodeRow> rows, std::span<float> logits) {
    CHECK_THROWS_AS(decoder.step(rows, logits), common::Error);
  };
  refused({{tokens[4], 8, 0, true}}, one);                 // position ≥ max_length
  refused({{tokens[4], -1, 0, true}}, one);                // negative position
  refused({{tokens[4], 4, 2, true}}, one);                 // slot out of range
  refused({{50, 4, 0, true}}, one);                        // token ≥ vocab_size (padding)
  refused({{-1, 4, 0, true}}, one);                        // negative token
  refused({{tokens[4], 5, 0, true}}, one);                 // position 4 of slot 0 not cached yet
  refused({{tokens[0], 1, 1, true}}, one);                 // slot 1 holds nothing yet
  refused({{tokens[4], 4, 0, true}, {tokens[5], 6, 0, true}}, {});  // a gap within the step
  refused({{tokens[4], 4, 0, true}, {tokens[4], 4, 0, true}}, {});  // one position twice
  refused({{tokens[4], 4, 0, true}}, {});                  // logits span too small
  refused({{tokens[4], 4, 0, false}}, one);                // logits span too large
  refused({}, {});                                         // no rows
  std::vector<DecodeRow> too_many;
  for (int32_t p = 4; p < 8; ++p) too_many.push_back({tokens[static_cast<size_t>(p)], p, 0, false});
  too_many.push_back({tokens[0], 0, 1, false});
  refused(too_many, {});  // 5 rows, max_rows 4

  // The refused steps changed nothing: slot 0 goes on at position 4.
  step_and_check(decoder, model, {{tokens[4], 4, 0, true}, {tokens[5], 5, 0, true}}, sequences,
                 "after refused steps");
}
