// The mock dataset behind --mock-data: deterministic pseudo-random tokens, for benchmarks and
// tests, with no files. Sample i of split s is seq_length + 1 tokens, token j being
//   splitmix64(seed, s, i, j) mod vocab_size
// so every sample is reproducible from its index alone: any process can build any batch,
// resuming needs only the consumed-sample count, and train/validation/test never share a
// sample. Megatron's MockGPTDataset fills samples with arange() instead; uniform random
// tokens make the first loss ln(vocab) exactly in expectation, which tests rely on.
// As in Megatron's GPT dataset, tokens = sample[0:T) and labels = sample[1:T+1).
#pragma once

#include <cstdint>
#include <span>

namespace backend {

enum class Split : uint64_t { train = 0, validation = 1, test = 2 };

class MockDataset {
 public:
  MockDataset(uint64_t seed, int64_t vocab_size, int64_t seq_length);

  // Fills tokens and labels, each (batch_size, seq_length), with samples
  // first_sample .. first_sample + batch_size − 1 of `split`.
  void fill_batch(Split split, int64_t first_sample, int64_t batch_size,
                  std::span<int32_t> tokens, std::span<int32_t> labels) const;

  int64_t vocab_size() const { return vocab_size_; }
  int64_t seq_length() const { return seq_length_; }

 private:
  uint64_t seed_;
  int64_t vocab_size_;
  int64_t seq_length_;
};

}  // namespace backend
