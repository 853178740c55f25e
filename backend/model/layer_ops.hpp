// The ops a transformer layer's configuration chooses, shared by the training model
// (gpt_model.cpp) and the incremental decoder (gpt_decoder.cpp): the norm --normalization
// picks (LayerNorm, scaling by weight + 1 with --apply-layernorm-1p, or RMSNorm, which has no
// bias and no mean), and RoPE on the query and key heads of a fused qkv activation (Megatron
// core's non-interleaved rotary embedding, applied per query group).
#pragma once

#include <cstdint>

#include "backend/core/view.hpp"
#include "backend/device/device.hpp"
#include "backend/model/gpt_config.hpp"
#include "backend/ops/norm_kind.hpp"

namespace backend {

// A norm's statistics, kept from its forward for its backward (mean unused by RMSNorm).
struct NormStatistics {
  View mean;
  View rstd;
};

// The norm's forward over `rows` rows of config.hidden_size: output = norm(input) with
// `weight` and `bias` (empty with RMSNorm); with `residual`, input = residual + branch first,
// in the same kernel (ops/norm_kind.hpp).
void norm_forward(Device& device, const GptConfig& config, View output,
                  const NormStatistics& statistics, View input, View weight, View bias,
                  int64_t rows, ResidualViews residual = {});
// Its backward: dinput from doutput (overwritten, or added to: `mode`), the weight and bias
// gradients accumulated.
void norm_backward(Device& device, const GptConfig& config, View dinput, View dweight, View dbias,
                   View doutput, View input, View weight, const NormStatistics& statistics,
                   int64_t rows, InputGradient mode = InputGradient::overwrite);

// RoPE's place in a fused qkv activation of `shard` (a tensor-parallel rank's heads): per query
// group the layout is [NH/NG query heads | key | value], so the first NH/NG + 1 heads of every
// group rotate (with NG = NH: q and k of every [q | k | v]).
struct RotatedHeads {
  int64_t heads = 0;        // rotated heads per group
  int64_t group_width = 0;  // elements of one group in a qkv row
};
RotatedHeads rotated_heads(const GptConfig& shard);

// The q and k heads of `qkv` (B, T, QKV) rotated in place by the tables (T, R/2); the backward
// rotates a gradient back.
void rotate_queries_and_keys(Device& device, const GptConfig& shard, View qkv, View cos, View sin,
                             int64_t batch_size, int64_t seq_length, bool backward);
// The same for `rows` rows at positions of their own (incremental decoding).
void rotate_queries_and_keys_at(Device& device, const GptConfig& shard, View qkv, View cos,
                                View sin, View positions, int64_t rows);

}  // namespace backend
