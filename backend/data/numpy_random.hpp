// numpy's legacy numpy.random.RandomState(seed), as far as Megatron's GPT dataset uses it:
// shuffle() of a 1-D array. Reproducing it exactly is what makes our document and shuffle
// indices, and so the order of training samples, identical to Megatron's
// (megatron/core/datasets/gpt_dataset.py: _build_document_index, _build_shuffle_index).
//
//   seeding   RandomState(s) for an integer 0 ≤ s < 2^32 is MT19937's init_genrand(s)
//             (numpy's mt19937_seed: key[0] = s, key[i] = 1812433253 · (key[i−1] ^
//             (key[i−1] >> 30)) + i), exactly std::mt19937's seeding.
//   shuffle   Fisher–Yates from the back: for i = n−1 down to 1, j = interval(i), swap x[i] and
//             x[j] (numpy's _shuffle_raw).
//   interval  numpy's random_interval(max): mask = the smallest 2^k − 1 ≥ max; draw
//             next_uint32() & mask (next_uint64() & mask when max ≥ 2^32) until ≤ max.
//   uint64    two 32-bit outputs, the first one the high word (mt19937_next64).
// tests/backend/data/numpy_random_test.cpp checks this against numpy itself.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace backend {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : engine_(seed) {}

  uint32_t next_uint32() { return static_cast<uint32_t>(engine_()); }
  uint64_t next_uint64() {
    const uint64_t high = next_uint32();
    return high << 32 | next_uint32();
  }

  // A uniform integer in [0, max], numpy's random_interval.
  uint64_t interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      do value = next_uint32() & mask; while (value > max);
    } else {
      do value = next_uint64() & mask; while (value > max);
    }
    return value;
  }

  // RandomState.shuffle of a 1-D array.
  template <typename T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i > 1;) {
      --i;  // not `i-- > 1`, which wraps below 0 for an empty array
      const auto j = static_cast<size_t>(interval(i));
      std::swap(values[i], values[j]);
    }
  }

 private:
  std::mt19937 engine_;
};

}  // namespace backend
