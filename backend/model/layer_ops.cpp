// The configured norm and rotary embedding (layer_ops.hpp).
#include "backend/model/layer_ops.hpp"

#include "backend/ops/layernorm.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/rope.hpp"

namespace backend {
namespace {

bool rms_norm(const GptConfig& config) {
  return config.normalization == Normalization::rms_norm;
}
// LayerNorm scales by weight + 1 with --apply-layernorm-1p (the weight is γ − 1).
double norm_weight_offset(const GptConfig& config) {
  return config.apply_layernorm_1p ? 1.0 : 0.0;
}

}  // namespace

void norm_forward(Device& device, const GptConfig& config, View output,
                  const NormStatistics& statistics, View input, View weight, View bias,
                  int64_t rows, ResidualViews residual) {
  if (rms_norm(config)) {
    ops::rmsnorm_forward(device, output, statistics.rstd, input, weight, config.layernorm_epsilon,
                         rows, config.hidden_size, residual);
  } else {
    ops::layernorm_forward(device, output, statistics.mean, statistics.rstd, input, weight, bias,
                           norm_weight_offset(config), config.layernorm_epsilon, rows,
                           config.hidden_size, residual);
  }
}

void norm_backward(Device& device, const GptConfig& config, View dinput, View dweight, View dbias,
                   View doutput, View input, View weight, const NormStatistics& statistics,
                   int64_t rows, InputGradient mode) {
  if (rms_norm(config)) {
    ops::rmsnorm_backward(device, dinput, dweight, doutput, input, weight, statistics.rstd, rows,
                          config.hidden_size, mode);
  } else {
    ops::layernorm_backward(device, dinput, dweight, dbias, doutput, input, weight,
                            norm_weight_offset(config), statistics.mean, statistics.rstd, rows,
                            config.hidden_size, mode);
  }
}

RotatedHeads rotated_heads(const GptConfig& shard) {
  const int64_t heads = shard.num_attention_heads / shard.query_groups() + 1;
  return {heads, (heads + 1) * shard.head_dim()};
}

void rotate_queries_and_keys(Device& device, const GptConfig& shard, View qkv, View cos, View sin,
                             int64_t batch_size, int64_t seq_length, bool backward) {
  const RotatedHeads rotated = rotated_heads(shard);
  for (int64_t g = 0; g < shard.query_groups(); ++g) {
    const View group = qkv.tail(g * rotated.group_width);
    if (backward) {
      ops::rope_backward(device, group, group, cos, sin, batch_size, seq_length, rotated.heads,
                         shard.head_dim(), shard.rotary_dim(), shard.qkv_features());
    } else {
      ops::rope_forward(device, group, group, cos, sin, batch_size, seq_length, rotated.heads,
                        shard.head_dim(), shard.rotary_dim(), shard.qkv_features());
    }
  }
}

void rotate_queries_and_keys_at(Device& device, const GptConfig& shard, View qkv, View cos,
                                View sin, View positions, int64_t rows) {
  const RotatedHeads rotated = rotated_heads(shard);
  for (int64_t g = 0; g < shard.query_groups(); ++g) {
    const View group = qkv.tail(g * rotated.group_width);
    ops::rope_at_positions_forward(device, group, group, cos, sin, positions, rows, rotated.heads,
                                   shard.head_dim(), shard.rotary_dim(), shard.qkv_features());
  }
}

}  // namespace backend
