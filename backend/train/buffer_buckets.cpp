// BufferBuckets (buffer_buckets.hpp): the overlapped collectives' buckets of units.
#include "backend/train/buffer_buckets.hpp"

#include <algorithm>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {

std::optional<std::string_view> reduction_after_backward(bool zero3, bool distributed_optimizer,
                                                         bool tied_embedding_across_stages) {
  if (zero3) return "ZeRO stage 3";
  if (distributed_optimizer && tied_embedding_across_stages) {
    return "the distributed optimizer and a word embedding tied across pipeline stages";
  }
  return std::nullopt;
}

int64_t default_ddp_bucket_size(int64_t data_parallel_size) {
  return std::max<int64_t>(40'000'000, 1'000'000 * data_parallel_size);
}

BufferBuckets::BufferBuckets(int64_t bucket_size, std::function<void(BufferRange)> start)
    : bucket_size_(bucket_size), start_(std::move(start)) {
  if (bucket_size_ < 1) {
    common::fail("--ddp-bucket-size {}: a bucket holds at least one element", bucket_size_);
  }
}

void BufferBuckets::add(BufferRange unit) {
  if (unit.numel <= 0) return;
  if (open_.numel > 0) {
    if (unit.offset + unit.numel == open_.offset) {
      open_ = {unit.offset, open_.numel + unit.numel};  // the next unit down (the backward's way)
    } else if (open_.offset + open_.numel == unit.offset) {
      open_.numel += unit.numel;  // the next unit up (the forward's way)
    } else {
      flush();
      open_ = unit;
    }
  } else {
    open_ = unit;
  }
  if (open_.numel >= bucket_size_) flush();
}

void BufferBuckets::flush() {
  if (open_.numel <= 0) return;
  const BufferRange bucket = open_;
  open_ = {};
  ++started_;
  start_(bucket);
}

}  // namespace backend
