// Megatron's BlendedDataset (megatron/core/datasets/blended_dataset.py, helpers.cpp
// build_blending_indices): samples drawn from several GPT datasets in proportion to weights.
// Sample i of the blend is sample dataset_sample_index[i] of dataset dataset_index[i], where
// the two arrays come from Megatron's greedy rule: at step i (x = max(i, 1)) take the dataset
// with the largest error weight_d · x − taken_d, the lowest index among equal errors, and its
// next sample.
//
// Megatron evaluates every dataset at every step, O(size × datasets): hours for a billion
// samples over thousands of datasets. build_blending_indices here gives the same arrays, bit
// for bit, with a kinetic tournament tree: each node keeps the winner of its two subtrees and
// the step until which that comparison provably cannot change (the lines weight · x − taken
// cross at a computable x; the bound allows for the rounding of Megatron's double arithmetic,
// which is reproduced exactly, fused multiply-adds excluded). A step then costs the datasets
// whose comparisons expire plus one leaf-to-root update, O(log datasets): for 2,419 datasets
// about 350 ns instead of 1.8 µs. Up to 384 datasets the scan itself is as fast, and is used.
//
// The arrays are cached only with --data-cache-path, as Megatron does, under Megatron's names:
// `<md5>-BlendedDataset-<split>-{description.txt,dataset_index.npy,dataset_sample_index.npy}`,
// the MD5 of Megatron's description (class, datasets, split, weights, size; written as Python's
// json.dumps(indent=4), megatron_description.hpp), so a cache Megatron wrote is reused.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/data/gpt_dataset.hpp"
#include "backend/data/npy_file.hpp"

namespace backend {

// Megatron's error of one dataset at step value x: weight · x − taken, in double arithmetic
// exactly as helpers.cpp computes it: a product, then a difference. The product is pinned in a
// register first, so the compiler cannot fuse the two into one FMA (-march=x86-64-v3 allows
// it, and a fused result can round differently); Megatron's helpers are built without FMA.
inline double blending_error(double weight, double x, int64_t taken) {
  double product = weight * x;
#if defined(__x86_64__)
  asm("" : "+x"(product));
#elif defined(__aarch64__)
  asm("" : "+w"(product));
#else
  volatile double stored = product;
  product = stored;
#endif
  return product - static_cast<double>(taken);
}

// Fills dataset_index and dataset_sample_index (both of the blend's size) as Megatron's
// build_blending_indices does, for at most 32,767 datasets.
void build_blending_indices(std::span<const double> weights, std::span<int16_t> dataset_index,
                            std::span<int64_t> dataset_sample_index);

class BlendedDataset {
 public:
  // `weights` are normalized again here, as Megatron's BlendedDataset does ("redundant
  // normalization for bitwise identical comparison"). `cache_path` empty: not cached.
  BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> datasets, std::vector<double> weights,
                 int64_t size, const std::string& cache_path);

  int64_t size() const { return size_; }
  void sample(int64_t index, std::span<int32_t> out) const;
  // Which dataset and which of its samples blend sample `index` is.
  std::pair<int64_t, int64_t> source(int64_t index) const;

  const std::vector<std::shared_ptr<const GptDataset>>& datasets() const { return datasets_; }
  const std::vector<double>& weights() const { return weights_; }
  const std::string& description_hash() const { return hash_; }

 private:
  std::vector<std::shared_ptr<const GptDataset>> datasets_;
  std::vector<double> weights_;
  int64_t size_ = 0;
  std::string hash_;
  // In memory when not cached, memory-mapped when cached.
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
  std::optional<NpyArray> cached_dataset_index_, cached_dataset_sample_index_;
};

}  // namespace backend
