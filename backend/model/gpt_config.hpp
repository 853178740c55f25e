// Shape of a GPT decoder, as Megatron-LM's flags describe it (--num-layers, --hidden-size,
// --num-attention-heads, --ffn-hidden-size, --max-position-embeddings, --seq-length,
// --init-method-std, --layernorm-epsilon, --make-vocab-size-divisible-by, --hidden-dropout,
// --attention-dropout).
// The vocabulary is padded as Megatron pads it (megatron/training/tokenizer:
// _vocab_size_with_padding): up to a multiple of make_vocab_size_divisible_by × tp.
#pragma once

#include <cstdint>

namespace backend {

struct GptConfig {
  int64_t num_layers = 12;
  int64_t hidden_size = 768;
  int64_t num_attention_heads = 12;
  int64_t ffn_hidden_size = 3072;          // Megatron's default: 4 × hidden_size
  int64_t max_position_embeddings = 2048;  // rows of the learned position table
  int64_t vocab_size = 50257;              // the tokenizer's vocabulary
  int64_t padded_vocab_size = 50304;       // rows of the word embedding / logits
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;
  // Dropout probabilities in [0, 1). Megatron's flags default to 0.1; here 0, so a model
  // built without them computes what it computed before dropout existed.
  double hidden_dropout = 0.0;     // after the embedding, in both bias-dropout-adds
  double attention_dropout = 0.0;  // on the attention probabilities

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// Megatron's padding rule: round vocab_size up to a multiple of divisible_by × tp.
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel);

// Throws common::Error naming the flag when the shape is inconsistent
// (heads must divide hidden, every size positive, padded ≥ vocab, dropout in [0, 1), ...).
void validate(const GptConfig& config);

}  // namespace backend
