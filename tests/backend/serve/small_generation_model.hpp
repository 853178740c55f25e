// The small GPT the generation tests sample from: 2 layers, hidden 16, 2 heads, the
// NullTokenizer's 63 ids + EOD (64) padded to 72 rows, so the argmax sometimes lands on a
// padding row, and a wide initialisation (std 0.5) so the logits are far enough apart that the
// argmax is clear.
#pragma once

#include <cstdint>

#include "backend/model/gpt_config.hpp"

namespace test_support {

inline constexpr int64_t kSmallGenerationPaddedVocab = 72;

inline backend::GptConfig small_generation_config(int64_t max_position_embeddings) {
  backend::GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 64;
  config.vocab_size = 64;  // NullTokenizer(63): ids 0..62 and eod 63
  config.padded_vocab_size = kSmallGenerationPaddedVocab;
  config.max_position_embeddings = max_position_embeddings;
  config.init_method_std = 0.5;
  return config;
}

}  // namespace test_support
