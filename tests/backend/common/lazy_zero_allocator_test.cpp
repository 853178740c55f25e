// LazyZeroAllocator: a vector of it holds zeros like std::vector, for blocks that come fresh
// from the kernel (large) and for blocks reused from freed, dirty memory (small and large).
#include "backend/common/lazy_zero_allocator.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace {

template <typename T>
using LazyZeroVector = std::vector<T, common::LazyZeroAllocator<T>>;

template <typename T>
bool all_zero(const LazyZeroVector<T>& values) {
  return std::all_of(values.begin(), values.end(), [](T value) { return value == T{0}; });
}

}  // namespace

TEST_CASE("a lazily zeroed vector holds zeros, also in memory freed dirty") {
  for (const size_t count : {size_t{1}, size_t{1000}, size_t{1} << 22}) {
    INFO("count " << count);
    {
      LazyZeroVector<float> dirty(count);
      CHECK(all_zero(dirty));
      std::fill(dirty.begin(), dirty.end(), 3.5f);
    }
    // The same size again: the allocator may hand back the block just freed.
    const LazyZeroVector<float> fresh(count);
    REQUIRE(fresh.size() == count);
    CHECK(all_zero(fresh));
    const LazyZeroVector<double> doubles(count);
    CHECK(all_zero(doubles));
  }
  // Construction with a value still writes it.
  const LazyZeroVector<float> filled(100, 2.0f);
  CHECK(std::all_of(filled.begin(), filled.end(), [](float value) { return value == 2.0f; }));
  LazyZeroVector<int> empty;
  CHECK(empty.empty());
}
