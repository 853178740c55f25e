// A GPT shape small enough to read every buffer of: 2 layers, hidden 8, 2 heads, FFN 16, a
// vocabulary of 10 padded to 12, 8 positions. The model-folder tests that look at buffers and
// units rather than numerics share it.
#pragma once

#include "backend/model/gpt_config.hpp"

namespace backend::testing {

inline GptConfig small_gpt_config(bool tied_embeddings = true) {
  GptConfig config;
  config.num_layers = 2;
  config.hidden_size = 8;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 16;
  config.vocab_size = 10;
  config.padded_vocab_size = padded_vocab_size(10, 4, 1);
  config.max_position_embeddings = 8;
  config.share_embeddings_and_output_weights = tied_embeddings;
  return config;
}

}  // namespace backend::testing
