// The tensor-parallel region of one model rank (Megatron core's tensor_parallel/mappings.py and
// cross_entropy.py; Shoeybi et al. 2019, Korthikanti et al. 2022): the group, whether the
// residual stream is sharded over it (--sequence-parallel), which rows of that stream this rank
// holds, and the collectives at the borders of the column- and row-parallel layers. A group of
// one makes every collective a no-op and every rank's rows the whole stream, so the model's
// composition (gpt_model.cpp) reads the same with and without tensor parallelism.
//
// Tensor parallelism (Megatron's tensor_parallel layers; Shoeybi et al. 2019): each of the tp
// ranks of the group holds the shards parameter_layout.hpp describes and computes
//   embedding    its vocabulary rows' word vectors (0 for other tokens; rank 0 adds the
//                position rows), all-reduced: VocabParallelEmbedding
//   linear_qkv, linear_fc1, output_layer   its output features (column-parallel: the input is
//                whole, the input gradient is all-reduced in the backward)
//   attention    its NH/tp heads, whole query groups
//   linear_proj, linear_fc2   its input features, the partial outputs all-reduced
//                (row-parallel; the bias is added once, by rank 0, so the sum holds it once)
//   loss         vocab-parallel cross-entropy: each rank's log-sum-exp over its vocabulary
//                shard is all-gathered and combined, the label's logit all-reduced
// The norms, residuals and hidden dropout work on the whole (identical) activations on every
// rank, so replicated parameters get identical gradients without communication. Hidden
// dropout masks are those of one rank; attention-probability masks are keyed by the rank too
// (each rank drops its own heads), as Megatron's model-parallel RNG tracker does.
//
// Sequence parallelism (--sequence-parallel; Korthikanti et al. 2022) shards the residual
// stream instead of repeating it: each rank holds rows [r·R/tp, (r+1)·R/tp) of the (R = B·T, C)
// embedding output, residuals and layer outputs, runs the norms and hidden dropout on them
// (mask indices offset by the first row, so the masks are one rank's), all-gathers a norm's
// output before a column-parallel layer and reduce-scatters a row-parallel layer's partial
// outputs (an all-reduce is exactly that pair). The backward mirrors it: the output gradient of
// a row-parallel layer is all-gathered, a column-parallel input gradient reduce-scattered. The
// norms' weight gradients then cover this rank's rows only and are summed over the group by
// GptModel::finalize_gradients() (Megatron's allreduce of the sequence-parallel layernorm grads).
// The gathered norm outputs are kept for the backward (Megatron gathers them again there): this
// saves the residual stream's memory, not theirs.
//
// Rows are the flat (B·T) rows of a micro batch (batch-major); under sequence parallelism rank r
// holds rows [r·R/tp, (r+1)·R/tp). Megatron's rows are sequence positions of its [s, b, h]
// layout: the same arithmetic, on another cut.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "backend/core/view.hpp"
#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"

namespace backend {

class TensorParallelRegion {
 public:
  // `group` nullptr: a group of one, made here. The group must outlive the region.
  // sequence_parallel takes effect with a group of more than one rank only.
  TensorParallelRegion(Communicator* group, bool sequence_parallel);

  Communicator& group() const { return *group_; }
  int64_t size() const { return size_; }
  int64_t rank() const { return rank_; }
  bool active() const { return size_ > 1; }
  bool sequence_parallel() const { return sequence_parallel_; }

  // The micro batches' rows (B·T), set when a shape is reserved.
  void set_rows(int64_t rows) { rows_ = rows; }
  // Rows of the residual stream this rank holds: all, or its share under sequence parallelism.
  int64_t stream_rows() const { return sequence_parallel_ ? rows_ / size_ : rows_; }
  // The index of this rank's first element in a whole (rows, width) tensor.
  int64_t first_own_element(int64_t width) const {
    return sequence_parallel_ ? rank_ * stream_rows() * width : 0;
  }
  // This rank's rows of a whole (rows, width) buffer; the whole buffer without sequence
  // parallelism.
  View own_rows(View whole, int64_t width) const {
    if (!sequence_parallel_) return whole;
    return whole.slice(first_own_element(width), stream_rows() * width);
  }

  // Megatron's reduce_from_tensor_model_parallel_region (or, under sequence parallelism, its
  // reduce_scatter_to_sequence_parallel_region): a row-parallel layer's partial outputs, or a
  // column-parallel layer's partial input gradients, in `partial` (rows, C), summed over the
  // group: all-reduced in place, or reduce-scattered into `shard` (this rank's rows). Returns
  // where the sum is.
  View reduce(View partial, View shard);
  // Megatron's gather_from_sequence_parallel_region: this rank's rows `stream` as the whole
  // (rows, C) tensor, all-gathered into `whole` under sequence parallelism, else `stream`
  // itself. Returns the whole tensor.
  View gather(View stream, View whole);
  // The per-position losses (and log-sum-exps) of `logits`, this rank's `vocab` columns from
  // `vocab_start` on: cross_entropy_forward alone, or Megatron's vocab_parallel_cross_entropy:
  // each shard's log-sum-exp all-gathered into `logsumexp_parts` (tp, rows) and combined, the
  // label's logit (`target_logit`, rows) all-reduced from the rank that holds it. Given
  // `gradient_scale`, the logits are then overwritten by their gradient times it (the fused
  // classifier: one op unsharded; the shard's backward in place after the combine otherwise).
  // `stored_gradient_scale` (one f64 of the device's memory, read when the fused classifier
  // runs: a captured step's) replaces gradient_scale's value; unsharded only.
  void cross_entropy(Device& device, View losses, View logsumexp, View logsumexp_parts,
                     View target_logit, View logits, View labels, int64_t rows, int64_t vocab,
                     int64_t vocab_start, std::optional<double> gradient_scale = std::nullopt,
                     View stored_gradient_scale = {});

 private:
  std::unique_ptr<Communicator> owned_group_;  // a group of one, when none was given
  Communicator* group_ = nullptr;
  int64_t size_ = 1;
  int64_t rank_ = 0;
  bool sequence_parallel_ = false;
  int64_t rows_ = 0;
};

}  // namespace backend
