// The model's flags → GptConfig; see model_arguments.hpp.
// Reference: megatron/training/arguments.py (core_transformer_config_from_args).
#include "backend/model/model_arguments.hpp"

#include "backend/common/error.hpp"

namespace backend {

GptConfig gpt_config(const ModelArguments& model, int64_t vocab_size,
                     int64_t tensor_model_parallel_size) {
  GptConfig config;
  config.num_layers = model.num_layers;
  config.hidden_size = model.hidden_size;
  config.num_attention_heads = model.num_attention_heads;
  config.ffn_hidden_size = model.ffn_hidden_size;
  config.max_position_embeddings = model.max_position_embeddings;
  config.vocab_size = vocab_size;
  config.padded_vocab_size =
      padded_vocab_size(vocab_size, model.make_vocab_size_divisible_by, tensor_model_parallel_size);
  config.layernorm_epsilon = model.norm_epsilon;
  config.init_method_std = model.init_method_std;
  config.hidden_dropout = model.hidden_dropout;
  config.attention_dropout = model.attention_dropout;
  config.position_embedding_type = model.position_embedding_type;
  config.rotary_base = model.rotary_base;
  if (model.use_rope_scaling) {
    config.rope_scaling = RopeScaling{.factor = model.rope_scaling_factor};
  }
  config.rotary_percent = model.rotary_percent;
  config.normalization = model.normalization;
  config.apply_layernorm_1p = model.apply_layernorm_1p;
  config.swiglu = model.swiglu;
  config.add_bias_linear = model.add_bias_linear;
  config.share_embeddings_and_output_weights = !model.untie_embeddings_and_output_weights;
  config.num_query_groups = model.group_query_attention ? model.num_query_groups : 0;
  config.recompute_granularity = model.recompute_granularity;
  if (model.recompute_granularity == RecomputeGranularity::full) {
    config.recompute_method = model.recompute_method.value_or(RecomputeMethod::uniform);
    config.recompute_num_layers = model.recompute_num_layers.value_or(1);
  }
  validate(config);
  return config;
}

ModelArguments model_arguments(const GptConfig& config) {
  ModelArguments model;
  model.num_layers = config.num_layers;
  model.hidden_size = config.hidden_size;
  model.ffn_hidden_size = config.ffn_hidden_size;
  model.num_attention_heads = config.num_attention_heads;
  model.max_position_embeddings = config.max_position_embeddings;
  model.seq_length = config.max_position_embeddings;
  model.init_method_std = config.init_method_std;
  model.norm_epsilon = config.layernorm_epsilon;
  model.position_embedding_type = config.position_embedding_type;
  model.rotary_base = config.rotary_base;
  model.rotary_percent = config.rotary_percent;
  if (const RopeScaling& scaling = config.rope_scaling; scaling.active()) {
    // Megatron's flags carry the factor; the other three are Llama 3.x's, fixed.
    if (scaling != RopeScaling{.factor = scaling.factor}) {
      common::fail(
          "RoPE scaling with low_freq_factor {}, high_freq_factor {} and "
          "original_max_position_embeddings {} has no pretrain_gpt flags: "
          "--use-rope-scaling keeps Llama 3.x's 1, 4 and 8192 (only "
          "--rope-scaling-factor is set)",
          scaling.low_frequency_factor, scaling.high_frequency_factor,
          scaling.original_max_position_embeddings);
    }
    model.use_rope_scaling = true;
    model.rope_scaling_factor = scaling.factor;
  }
  model.normalization = config.normalization;
  model.apply_layernorm_1p = config.apply_layernorm_1p;
  model.swiglu = config.swiglu;
  model.add_bias_linear = config.add_bias_linear;
  model.untie_embeddings_and_output_weights = !config.share_embeddings_and_output_weights;
  model.group_query_attention = config.num_query_groups > 0;
  if (model.group_query_attention) model.num_query_groups = config.num_query_groups;
  model.hidden_dropout = config.hidden_dropout;
  model.attention_dropout = config.attention_dropout;
  // The largest power of two up to 128 that pads the vocabulary to the config's rows, else the
  // rows themselves.
  model.make_vocab_size_divisible_by = config.padded_vocab_size;
  for (int64_t divisor = 128; divisor >= 1; divisor /= 2) {
    if (padded_vocab_size(config.vocab_size, divisor, 1) == config.padded_vocab_size) {
      model.make_vocab_size_divisible_by = divisor;
      break;
    }
  }
  return model;
}

}  // namespace backend
