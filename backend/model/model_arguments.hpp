// The model's flags as one value: Megatron-LM's network-size arguments (_add_network_size_args),
// the Llama-family switches and activation recompute, under Megatron's dest names, with its
// enum-like settings as enums (their spellings in gpt_config.hpp). pretrain_gpt's parser fills
// it from kModelFlags (backend/train/arguments.cpp), a checkpoint's record of its arguments
// gives it back (backend/ckpt/checkpoint_record.hpp), and gpt_config() turns it into the
// model the layers are built from, as Megatron's core_transformer_config_from_args turns args
// into a TransformerConfig.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/device/cuda_context.hpp"
#include "backend/model/gpt_config.hpp"

namespace backend {

struct ModelArguments {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // 0 → 4 × hidden_size (SwiGLU: 2/3 of it, a multiple of 64)
  int64_t num_attention_heads = 0;
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;  // 0 → seq_length
  int64_t make_vocab_size_divisible_by = 128;
  double init_method_std = 0.02;
  double norm_epsilon = 1e-5;  // --norm-epsilon (old name --layernorm-epsilon)
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  // Llama-family switches.
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::learned_absolute;
  int64_t rotary_base = 10000;
  double rotary_percent = 1.0;
  bool use_rope_scaling = false;     // --use-rope-scaling: Llama 3's RoPE frequency scaling
  double rope_scaling_factor = 8.0;  // --rope-scaling-factor (Megatron's default, Llama 3.1's)
  Normalization normalization = Normalization::layer_norm;
  bool apply_layernorm_1p = false;  // LayerNorm weights as γ − 1 (NeMo's layernorm1p)
  bool swiglu = false;
  bool add_bias_linear = true;  // --disable-bias-linear clears it
  bool untie_embeddings_and_output_weights = false;
  bool group_query_attention = false;
  int64_t num_query_groups = 1;  // read only with --group-query-attention (Megatron's default)
  // Activation recompute: none and std::nullopt are Megatron's None; --recompute-activations
  // sets selective.
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  std::optional<RecomputeMethod> recompute_method;  // full only
  std::optional<int64_t> recompute_num_layers;      // full only
  // The GPU's attention kernels (--attention-backend; attention is fused on every device either
  // way). --use-flash-attn, Megatron's older spelling of flash, is kept as given.
  AttentionBackend attention_backend = AttentionBackend::automatic;
  bool use_flash_attn = false;
};

// The validated model the flags describe (validate() in gpt_config.hpp), for a tokenizer of
// `vocab_size` entries padded as Megatron pads it for `tensor_model_parallel_size` ranks. Its
// precision and inference_only are the caller's to set.
GptConfig gpt_config(const ModelArguments& model, int64_t vocab_size,
                     int64_t tensor_model_parallel_size);

// The flags that describe `config` (one rank's whole model, tp 1), the inverse of gpt_config:
// gpt_config(model_arguments(config), config.vocab_size, 1) gives `config` back, its recompute
// and precision aside. RoPE scaling other than Llama 3.x's (which no flag describes) is a
// common::Error.
ModelArguments model_arguments(const GptConfig& config);

}  // namespace backend
