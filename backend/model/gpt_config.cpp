// Validation and vocabulary padding for GptConfig; see gpt_config.hpp.
#include "backend/model/gpt_config.hpp"

#include <algorithm>
#include <cmath>

#include "backend/common/checked_math.hpp"
#include "backend/common/error.hpp"

namespace backend {

using common::checked_add;
using common::checked_multiply;

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel) {
  if (vocab_size <= 0) common::fail("--vocab-size must be positive, got {}", vocab_size);
  if (divisible_by <= 0) {
    common::fail("--make-vocab-size-divisible-by must be positive, got {}", divisible_by);
  }
  if (tensor_parallel <= 0) {
    common::fail("--tensor-model-parallel-size must be positive, got {}", tensor_parallel);
  }
  const int64_t multiple = checked_multiply(
      divisible_by, tensor_parallel, "--make-vocab-size-divisible-by × tensor-parallel size");
  const int64_t rounded_up = checked_add(
      vocab_size, multiple - 1,
      "the padded vocabulary (the vocabulary rounded up to a multiple of "
      "--make-vocab-size-divisible-by × tensor-parallel size)");
  return rounded_up / multiple * multiple;
}

int64_t parameter_count(const GptConfig& config) {
  const int64_t C = config.hidden_size;
  const int64_t F = config.ffn_hidden_size;
  const int64_t F1 = config.swiglu ? checked_multiply(2, F, "linear_fc1's rows (2 × --ffn-hidden-size "
                                                            "with --swiglu)")
                                   : F;
  // (NH + 2·NG) · HD; NG and HD divide what they are taken from, so only the sum can overflow.
  const int64_t QKV = checked_multiply(
      checked_add(config.num_attention_heads,
                  checked_multiply(2, config.query_groups(), "2 × --num-query-groups"),
                  "linear_qkv's heads (--num-attention-heads + 2 × --num-query-groups)"),
      config.head_dim(),
      "linear_qkv's rows ((--num-attention-heads + 2 × --num-query-groups) × the head size, "
      "--hidden-size / --num-attention-heads)");
  const bool layer_norm = config.normalization == Normalization::layer_norm;
  const int64_t norm = layer_norm ? checked_multiply(2, C, "a LayerNorm (2 × --hidden-size)") : C;

  int64_t per_layer = 0;
  auto add = [&](int64_t& sum, int64_t count) {
    sum = checked_add(sum, count, "the parameters of the model (a sum of the tensors above)");
  };
  add(per_layer, checked_multiply(QKV, C, "linear_qkv (its rows × --hidden-size)"));
  add(per_layer, checked_multiply(C, C, "linear_proj (--hidden-size × --hidden-size)"));
  add(per_layer, checked_multiply(F1, C, "linear_fc1 (--ffn-hidden-size × --hidden-size)"));
  add(per_layer, checked_multiply(C, F, "linear_fc2 (--hidden-size × --ffn-hidden-size)"));
  add(per_layer, checked_multiply(2, norm, "a layer's two norms"));
  if (config.add_bias_linear) {
    for (const int64_t bias : {QKV, C, F1, C}) add(per_layer, bias);
  }
  int64_t total = checked_multiply(config.num_layers, per_layer,
                                   "the layers' parameters (--num-layers × a layer's)");
  const int64_t vocabulary =
      checked_multiply(config.padded_vocab_size, C,
                       "the word embedding (padded vocabulary × --hidden-size)");
  add(total, vocabulary);
  if (!config.share_embeddings_and_output_weights) add(total, vocabulary);
  if (config.position_embedding_type == PositionEmbeddingType::learned_absolute) {
    add(total, checked_multiply(config.max_position_embeddings, C,
                                "the position table (--max-position-embeddings × --hidden-size)"));
  }
  add(total, norm);
  return total;
}

common::ModelShape model_shape(const GptConfig& config) {
  return {.num_layers = config.num_layers,
          .hidden_size = config.hidden_size,
          .num_attention_heads = config.num_attention_heads,
          .num_query_groups = config.query_groups(),
          .ffn_hidden_size = config.ffn_hidden_size,
          .padded_vocab_size = config.padded_vocab_size,
          .position_rows = config.position_embedding_type == PositionEmbeddingType::learned_absolute
                               ? config.max_position_embeddings
                               : 0,
          .gated_mlp = config.swiglu,
          .linear_biases = config.add_bias_linear,
          .norm_biases = config.normalization == Normalization::layer_norm,
          .untied_output = !config.share_embeddings_and_output_weights};
}

common::MemoryEstimate training_memory_estimate(const GptConfig& config, int64_t micro_batch_size,
                                                int64_t seq_length,
                                                const TrainingParallelism& parallelism) {
  common::TrainingSetup setup;
  setup.tensor_parallel = parallelism.tensor_parallel;
  setup.data_parallel = parallelism.data_parallel;
  setup.pipeline_parallel = parallelism.pipeline_parallel;
  setup.sequence_parallel = parallelism.sequence_parallel;
  setup.virtual_pipeline_chunks = parallelism.virtual_pipeline_chunks;
  setup.zero_stage = parallelism.zero_stage != 0 ? parallelism.zero_stage
                                                 : (parallelism.distributed_optimizer ? 1 : 0);
  setup.offload_optimizer = parallelism.offload_optimizer;
  setup.offload_parameters = parallelism.offload_parameters;
  setup.seq_length = seq_length;
  setup.micro_batch_size = micro_batch_size;
  setup.attention_scores_stored = false;
  // bf16 or fp16 working weights and activations
  setup.mixed_precision = config.mixed_precision != MixedPrecision::none;
  switch (config.recompute_granularity) {
    case RecomputeGranularity::none:
      setup.recompute = common::Recompute::none;
      break;
    case RecomputeGranularity::selective:
      setup.recompute = common::Recompute::selective;
      break;
    case RecomputeGranularity::full:
      setup.recompute = common::Recompute::full;
      break;
  }
  return common::estimate_training_memory(model_shape(config), setup);
}

void check_tensor_parallel(const GptConfig& config, int64_t tensor_parallel) {
  if (tensor_parallel < 1) {
    common::fail("--tensor-model-parallel-size must be at least 1, got {}", tensor_parallel);
  }
  auto divisible = [&](int64_t value, const char* what) {
    if (value % tensor_parallel != 0) {
      common::fail("{} ({}) must be divisible by --tensor-model-parallel-size ({})", what, value,
                   tensor_parallel);
    }
  };
  divisible(config.num_attention_heads, "--num-attention-heads");
  divisible(config.query_groups(), "--num-query-groups");
  divisible(config.ffn_hidden_size, "--ffn-hidden-size");
  divisible(config.padded_vocab_size,
            "the padded vocabulary (--vocab-size rounded up to --make-vocab-size-divisible-by × "
            "--tensor-model-parallel-size)");
}

GptConfig tensor_parallel_shard(const GptConfig& config, int64_t tensor_parallel) {
  check_tensor_parallel(config, tensor_parallel);
  GptConfig shard = config;
  shard.kv_channels = config.head_dim();
  shard.num_attention_heads = config.num_attention_heads / tensor_parallel;
  shard.num_query_groups = config.query_groups() / tensor_parallel;
  shard.ffn_hidden_size = config.ffn_hidden_size / tensor_parallel;
  shard.padded_vocab_size = config.padded_vocab_size / tensor_parallel;
  shard.vocab_size = std::min(shard.vocab_size, shard.padded_vocab_size);
  return shard;
}

void validate(const GptConfig& config) {
  auto positive = [](int64_t value, const char* flag) {
    if (value <= 0) common::fail("{} must be positive, got {}", flag, value);
  };
  positive(config.num_layers, "--num-layers");
  positive(config.hidden_size, "--hidden-size");
  positive(config.num_attention_heads, "--num-attention-heads");
  positive(config.ffn_hidden_size, "--ffn-hidden-size");
  positive(config.max_position_embeddings, "--max-position-embeddings");
  positive(config.vocab_size, "--vocab-size");
  if (config.hidden_size % config.num_attention_heads != 0) {
    common::fail("--num-attention-heads {} must divide --hidden-size {}",
                 config.num_attention_heads, config.hidden_size);
  }
  if (config.num_query_groups < 0 || config.num_attention_heads % config.query_groups() != 0) {
    common::fail("--num-query-groups {} must be positive and divide --num-attention-heads {}",
                 config.num_query_groups, config.num_attention_heads);
  }
  if (config.padded_vocab_size < config.vocab_size) {
    common::fail("padded vocabulary {} is smaller than --vocab-size {}",
                 config.padded_vocab_size, config.vocab_size);
  }
  if (config.apply_layernorm_1p && config.normalization != Normalization::layer_norm) {
    common::fail("--apply-layernorm-1p applies to LayerNorm; it cannot be combined with "
                 "--normalization RMSNorm (NeMo's normalization: layernorm1p is LayerNorm)");
  }
  if (!(config.layernorm_epsilon > 0)) {
    common::fail("--norm-epsilon must be positive, got {}", config.layernorm_epsilon);
  }
  if (!(config.init_method_std > 0)) {
    common::fail("--init-method-std must be positive, got {}", config.init_method_std);
  }
  auto probability = [](double value, const char* flag) {
    if (!(value >= 0 && value < 1)) common::fail("{} must lie in [0, 1), got {}", flag, value);
  };
  probability(config.hidden_dropout, "--hidden-dropout");
  probability(config.attention_dropout, "--attention-dropout");
  if (config.recompute_granularity == RecomputeGranularity::full) {
    // Block with 0 layers recomputes nothing, as in Megatron; uniform chunks need a size.
    const int64_t least = config.recompute_method == RecomputeMethod::uniform ? 1 : 0;
    if (config.recompute_num_layers < least) {
      common::fail("--recompute-num-layers must be at least {} with --recompute-method {}, got {}",
                   least, config.recompute_method == RecomputeMethod::uniform ? "uniform" : "block",
                   config.recompute_num_layers);
    }
  }
  if (config.position_embedding_type == PositionEmbeddingType::rope) {
    if (config.rotary_base <= 0) {
      common::fail("--rotary-base must be positive, got {}", config.rotary_base);
    }
    if (!(config.rotary_percent > 0 && config.rotary_percent <= 1)) {
      common::fail("--rotary-percent must lie in (0, 1], got {}", config.rotary_percent);
    }
    // Megatron rotates 2 · ceil(d / 2) features for d = int(head_dim × percent); an odd d
    // would rotate one feature more than asked, so it is refused rather than guessed.
    const int64_t rotary_dim = config.rotary_dim();
    if (rotary_dim < 2 || rotary_dim % 2 != 0) {
      common::fail(
          "--rotary-percent {} rotates {} of the {} features of a head (--hidden-size {} "
          "/ --num-attention-heads {}); RoPE needs an even number, at least 2",
          config.rotary_percent, rotary_dim, config.head_dim(), config.hidden_size,
          config.num_attention_heads);
    }
  }
  if (const RopeScaling& scaling = config.rope_scaling; scaling.active()) {
    if (config.position_embedding_type != PositionEmbeddingType::rope) {
      common::fail("--use-rope-scaling scales RoPE's frequencies: it needs "
                   "--position-embedding-type rope");
    }
    // Hugging Face's rope_type llama3 requires factor ≥ 1; below 1 it would shorten the
    // wavelengths it is meant to stretch.
    if (!(scaling.factor >= 1 && std::isfinite(scaling.factor))) {
      common::fail("--rope-scaling-factor must be a finite number ≥ 1, got {}", scaling.factor);
    }
    if (!(scaling.low_frequency_factor > 0 &&
          scaling.low_frequency_factor < scaling.high_frequency_factor &&
          std::isfinite(scaling.high_frequency_factor) &&
          scaling.original_max_position_embeddings > 0 &&
          std::isfinite(scaling.original_max_position_embeddings))) {
      common::fail("RoPE scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
                   "original_max_position_embeddings, got {}, {} and {}",
                   scaling.low_frequency_factor, scaling.high_frequency_factor,
                   scaling.original_max_position_embeddings);
    }
  }
  parameter_count(config);  // every tensor's size, and their sum, fit int64
}

}  // namespace backend
