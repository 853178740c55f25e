// The buckets of --overlap-grad-reduce and --overlap-param-gather (Megatron core's
// DistributedDataParallel buckets, distributed/param_and_grad_buffer.py): units of the flat
// buffers (ParameterStore's) join the open bucket in the order they are added; once the bucket
// holds at least --ddp-bucket-size elements it is handed on (its collective starts) and a new
// one opens; flush() hands on what remains. The gradients' units come in the backward's order
// (the head, each layer from the last, the embedding, announced as the last micro batch's
// backward finishes them), the parameters' in the forward's (the embedding first), so that the
// first forward waits for the first bucket only. A unit that does not adjoin the open bucket
// (not expected from the model's order, but not assumed) closes it first, so every bucket is one
// contiguous range. Every rank adds the same units in the same order, so the buckets, and the
// order their collectives start in, agree across the group.
//
// Megatron cuts its buckets at parameter boundaries within a layer; here a unit (a whole layer)
// is the smallest piece, so a bucket can exceed the size by up to one unit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "backend/model/parameter_layout.hpp"

namespace backend {

// Why --overlap-grad-reduce cannot start the data-parallel reduction during the backward in a
// layout, or nullopt where it can: ZeRO-3 (its units reduce themselves after their backward),
// and the distributed optimizer with a word embedding tied across the pipeline's first and last
// stages (its two gradients are summed on the whole buffer before the shards are taken). There
// the reduction runs after the backward, with the same results. One rule for the step
// (train_step.cpp) and the warning (arguments.cpp).
std::optional<std::string_view> reduction_after_backward(bool zero3, bool distributed_optimizer,
                                                         bool tied_embedding_across_stages);

// Megatron's default when --ddp-bucket-size is not given (training.py's resolve of
// ddp_bucket_size): max(40,000,000, 1,000,000 × data-parallel size) elements.
int64_t default_ddp_bucket_size(int64_t data_parallel_size);

class BufferBuckets {
 public:
  // `bucket_size` ≥ 1 elements; `start` is called with each bucket's range of the flat buffer.
  BufferBuckets(int64_t bucket_size, std::function<void(BufferRange)> start);

  void add(BufferRange unit);
  void flush();
  int64_t started() const { return started_; }  // buckets handed on so far

 private:
  int64_t bucket_size_;
  std::function<void(BufferRange)> start_;
  BufferRange open_{};
  int64_t started_ = 0;
};

}  // namespace backend
