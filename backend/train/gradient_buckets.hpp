// --overlap-grad-reduce's buckets (Megatron core's DistributedDataParallel buckets,
// distributed/param_and_grad_buffer.py): as the last micro batch's backward finishes each unit
// of the flat gradient buffer (the head, each layer from the last, the embedding: ParameterStore's
// units, announced in that order), its range joins the open bucket; once the bucket holds at
// least --ddp-bucket-size elements it is handed on (its all-reduce starts) and a new one opens;
// flush() hands on what remains after the backward. A unit that does not adjoin the open bucket
// (not expected from the model's order, but not assumed) closes it first, so every bucket is one
// contiguous range. Every rank sees the same units in the same order, so the buckets, and the
// order their reductions start in, agree across the group.
//
// Megatron cuts its buckets at parameter boundaries within a layer; here a unit (a whole layer)
// is the smallest piece, so a bucket can exceed the size by up to one unit.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/model/parameter_layout.hpp"

namespace backend {

// Megatron's default when --ddp-bucket-size is not given (training.py's resolve of
// ddp_bucket_size): max(40,000,000, 1,000,000 × data-parallel size) elements.
int64_t default_ddp_bucket_size(int64_t data_parallel_size);

class GradientBuckets {
 public:
  // `bucket_size` ≥ 1 elements; `start` is called with each bucket's range of the flat buffer.
  GradientBuckets(int64_t bucket_size, std::function<void(BufferRange)> start);

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
