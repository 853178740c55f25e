// TensorParallelRegion (tensor_parallel_region.hpp): the tensor-parallel and sequence-parallel
// collectives of a model rank, and the vocab-parallel cross-entropy (Megatron core's
// tensor_parallel/mappings.py and cross_entropy.py).
#include "backend/model/tensor_parallel_region.hpp"

#include "backend/ops/cross_entropy.hpp"

namespace backend {

TensorParallelRegion::TensorParallelRegion(Communicator* group, bool sequence_parallel) {
  if (group == nullptr) {
    owned_group_ = make_single_process_communicator("tensor parallel");
    group = owned_group_.get();
  }
  group_ = group;
  size_ = group->size();
  rank_ = group->rank();
  sequence_parallel_ = sequence_parallel && size_ > 1;
}

View TensorParallelRegion::reduce(View partial, View shard) {
  if (sequence_parallel_) {
    group_->reduce_scatter(shard, partial);
    return shard;
  }
  if (active()) group_->all_reduce(partial, ReduceOperation::sum);
  return partial;
}

View TensorParallelRegion::gather(View stream, View whole) {
  if (!sequence_parallel_) return stream;
  group_->all_gather(whole, stream);
  return whole;
}

void TensorParallelRegion::cross_entropy(Device& device, View losses, View logsumexp,
                                         View logsumexp_parts, View target_logit, View logits,
                                         View labels, int64_t rows, int64_t vocab,
                                         int64_t vocab_start, std::optional<double> gradient_scale,
                                         View stored_gradient_scale) {
  if (!active()) {
    if (gradient_scale) {
      ops::cross_entropy_forward_backward(device, losses, logsumexp, logits, labels,
                                          *gradient_scale, rows, vocab, stored_gradient_scale);
    } else {
      ops::cross_entropy_forward(device, losses, logsumexp, logits, labels, rows, vocab);
    }
    return;
  }
  // The shards' log-sum-exps side by side (the all-gather fills the other ranks' rows around
  // this rank's), the label's logit from the rank that holds it.
  const View own_part = logsumexp_parts.slice(rank_ * rows, rows);
  ops::vocab_parallel_cross_entropy_partial(device, own_part, target_logit, logits, labels, rows,
                                            vocab, vocab_start);
  group_->all_gather(logsumexp_parts, own_part);
  group_->all_reduce(target_logit, ReduceOperation::sum);
  ops::vocab_parallel_cross_entropy_combine(device, losses, logsumexp, logsumexp_parts,
                                            target_logit, labels, rows, size_);
  if (gradient_scale) {
    ops::cross_entropy_backward(device, logits, logits, logsumexp, labels, *gradient_scale, rows,
                                vocab, vocab_start, stored_gradient_scale);
  }
}

}  // namespace backend
