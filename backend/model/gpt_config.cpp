// Validation and vocabulary padding for GptConfig; see gpt_config.hpp.
#include "backend/model/gpt_config.hpp"

#include "backend/common/error.hpp"

namespace backend {

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel) {
  if (vocab_size <= 0) common::fail("--vocab-size must be positive, got {}", vocab_size);
  if (divisible_by <= 0) {
    common::fail("--make-vocab-size-divisible-by must be positive, got {}", divisible_by);
  }
  const int64_t multiple = divisible_by * tensor_parallel;
  return (vocab_size + multiple - 1) / multiple * multiple;
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
}

}  // namespace backend
