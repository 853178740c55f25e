// Counter-based mock tokens; see mock_dataset.hpp.
#include "backend/data/mock_dataset.hpp"

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"

namespace backend {

namespace {
// splitmix64's finaliser after one increment: output 0 of the stream keyed by x.
constexpr uint64_t mix(uint64_t x) { return common::splitmix64_at(x, 0); }
}  // namespace

MockDataset::MockDataset(uint64_t seed, int64_t vocab_size, int64_t seq_length)
    : seed_(seed), vocab_size_(vocab_size), seq_length_(seq_length) {
  if (vocab_size <= 0) common::fail("mock data: vocabulary size must be positive, got {}", vocab_size);
  if (seq_length <= 0) common::fail("mock data: --seq-length must be positive, got {}", seq_length);
}

void MockDataset::fill_batch(Split split, int64_t first_sample, int64_t batch_size,
                             std::span<int32_t> tokens, std::span<int32_t> labels) const {
  const int64_t T = seq_length_;
  if (static_cast<int64_t>(tokens.size()) != batch_size * T ||
      static_cast<int64_t>(labels.size()) != batch_size * T) {
    common::fail("mock data: batch buffers hold {} and {} tokens, expected {} × {}", tokens.size(),
                 labels.size(), batch_size, T);
  }
  const uint64_t stream = mix(seed_ ^ mix(static_cast<uint64_t>(split)));
  for (int64_t b = 0; b < batch_size; ++b) {
    const uint64_t sample_key = mix(stream + static_cast<uint64_t>(first_sample + b));
    auto token_at = [&](int64_t position) {
      return static_cast<int32_t>(mix(sample_key + static_cast<uint64_t>(position)) %
                                  static_cast<uint64_t>(vocab_size_));
    };
    for (int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = token_at(t);
      labels[b * T + t] = token_at(t + 1);
    }
  }
}

}  // namespace backend
