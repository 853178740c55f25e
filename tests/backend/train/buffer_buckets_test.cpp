// BufferBuckets: units merged, in the backward's order (the gradients') or the forward's (the
// parameters'), into contiguous buckets of at least --ddp-bucket-size elements; the remainder at
// flush; a unit that does not adjoin closes the open bucket; Megatron's default size; the layouts
// whose reduction runs after the backward.
#include "backend/train/buffer_buckets.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "backend/common/error.hpp"

using backend::BufferBuckets;
using backend::BufferRange;

namespace {

bool same(const std::vector<BufferRange>& got, const std::vector<BufferRange>& expected) {
  if (got.size() != expected.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].offset != expected[i].offset || got[i].numel != expected[i].numel) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("units join buckets from the end of the buffer until each holds the bucket size") {
  // embedding [0, 40), three layers of 30, the head [130, 140): announced head first.
  const std::vector<BufferRange> units = {{130, 10}, {100, 30}, {70, 30}, {40, 30}, {0, 40}};
  std::vector<BufferRange> buckets;
  BufferBuckets collector(50, [&](BufferRange bucket) { buckets.push_back(bucket); });
  for (const BufferRange& unit : units) collector.add(unit);
  // head + layer 2 = 40 < 50, + layer 1 = 70: a bucket; layer 0 + embedding = 70: another.
  CHECK(same(buckets, {{70, 70}, {0, 70}}));
  collector.flush();
  CHECK(buckets.size() == 2);
  CHECK(collector.started() == 2);

  // A bucket size above the whole buffer: one bucket, at flush.
  buckets.clear();
  BufferBuckets whole(1000, [&](BufferRange bucket) { buckets.push_back(bucket); });
  for (const BufferRange& unit : units) whole.add(unit);
  CHECK(buckets.empty());
  whole.flush();
  CHECK(same(buckets, {{0, 140}}));

  // One element: every unit its own bucket, in order.
  buckets.clear();
  BufferBuckets each(1, [&](BufferRange bucket) { buckets.push_back(bucket); });
  for (const BufferRange& unit : units) each.add(unit);
  CHECK(same(buckets, units));
}

TEST_CASE("units in the forward's order join buckets from the start of the buffer") {
  // --overlap-param-gather: the embedding first, so the first forward waits for the first bucket.
  const std::vector<BufferRange> units = {{0, 40}, {40, 30}, {70, 30}, {100, 30}, {130, 10}};
  std::vector<BufferRange> buckets;
  BufferBuckets collector(50, [&](BufferRange bucket) { buckets.push_back(bucket); });
  for (const BufferRange& unit : units) collector.add(unit);
  collector.flush();
  // embedding + layer 0 = 70: a bucket; layers 1 and 2 = 60: another; the head at flush.
  CHECK(same(buckets, {{0, 70}, {70, 60}, {130, 10}}));
  CHECK(collector.started() == 3);
}

TEST_CASE("a unit that does not adjoin the open bucket closes it, and empty units are skipped") {
  std::vector<BufferRange> buckets;
  BufferBuckets collector(100, [&](BufferRange bucket) { buckets.push_back(bucket); });
  collector.add({50, 10});
  collector.add({0, 0});
  collector.add({60, 5});  // adjoining above
  collector.add({10, 5});  // a gap: [50, 65) closes
  collector.flush();
  CHECK(same(buckets, {{50, 15}, {10, 5}}));
}

TEST_CASE("Megatron's default bucket size, and a size below one element is refused") {
  CHECK(backend::default_ddp_bucket_size(8) == 40'000'000);
  CHECK(backend::default_ddp_bucket_size(64) == 64'000'000);
  CHECK_THROWS_WITH_AS(BufferBuckets(0, [](BufferRange) {}),
                       "--ddp-bucket-size 0: a bucket holds at least one element", common::Error);
}

TEST_CASE("the layouts whose gradient reduction runs after the backward, and why") {
  using backend::reduction_after_backward;
  CHECK_FALSE(reduction_after_backward(false, false, false));
  CHECK_FALSE(reduction_after_backward(false, true, false));  // distributed optimizer
  CHECK_FALSE(reduction_after_backward(false, false, true));  // DDP sums the tied copies after
  CHECK(reduction_after_backward(true, false, false) == "ZeRO stage 3");
  CHECK(reduction_after_backward(false, true, true) ==
        "the distributed optimizer and a word embedding tied across pipeline stages");
}
