// Megatron's BlendedMegatronDatasetBuilder (megatron/core/datasets/
// blended_megatron_dataset_builder.py) for GPT datasets: from the run's data sources and the
// samples each split needs, the dataset each split reads.
//
//   one prefix, no weight   each split is a GPTDataset over its --split range of the sequences
//   a weighted blend        each prefix gets a GPTDataset per split asking for
//                           ceil(ceil(size · weight) · 1.005) samples (Megatron's
//                           mid_level_dataset_surplus of 0.5 %), blended by the weights into
//                           Σ_d ceil(size · weight_d) samples (≥ the size)
//   prefixes, no weights    each prefix's GPTDataset covers one epoch of its range; they are
//                           blended by their sample counts into min(size, Σ counts) samples
//   per split               --train-data-path etc.: the same rules with the whole dataset as
//                           the split's range; a single prefix ignores its weight, as Megatron
// Datasets of a blend are opened and indexed in parallel (one task per distinct prefix; a
// prefix named twice with the same request is one dataset, built once).
//
// Where Megatron asserts or loops forever, and where it silently skips: a split that the run
// reads (its size is above 0) but that the sources leave without data (a zero --split share,
// no --valid-data-path, a range without tokens) is an error naming the split, the dataset and
// `why_needed`, which the caller fills with the flags that asked for the samples. A split the run
// does not read (size 0) is not built at all (Megatron builds one epoch of it). The test split
// alone is skipped as Megatron skips it when the sources give it nothing (a zero share, as in
// --split 98,2,0, or no --test-data-path): it is left null, and the run has no test pass.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/data/blended_dataset.hpp"
#include "backend/data/data_blend.hpp"
#include "backend/data/gpt_dataset.hpp"

namespace backend {

// Megatron's mid_level_dataset_surplus default.
constexpr double kMidLevelDatasetSurplus = 0.005;

// The samples one split reads: a GPT dataset or a blend of them.
class SplitDataset {
 public:
  explicit SplitDataset(std::shared_ptr<const GptDataset> dataset) : single_(std::move(dataset)) {}
  explicit SplitDataset(std::shared_ptr<const BlendedDataset> blend) : blend_(std::move(blend)) {}

  int64_t size() const { return single_ ? single_->size() : blend_->size(); }
  void sample(int64_t index, std::span<int32_t> out) const {
    if (single_) {
      single_->sample(index, out);
    } else {
      blend_->sample(index, out);
    }
  }
  const std::shared_ptr<const GptDataset>& single() const { return single_; }
  const std::shared_ptr<const BlendedDataset>& blend() const { return blend_; }

 private:
  std::shared_ptr<const GptDataset> single_;
  std::shared_ptr<const BlendedDataset> blend_;
};

struct GptDataBuildOptions {
  DataSources sources;
  GptDatasetConfig dataset;  // seed, sequence length, tokenizer, cache path; split set here
  int num_threads = 1;       // datasets of a blend opened and indexed at once
  // Per split (train, validation, test): why the run needs its samples, for error messages,
  // e.g. "validation needs 320 samples (--eval-iters 10 × ...): give it a share in --split".
  std::array<std::string, 3> why_needed;
};

// Megatron's _get_size_per_split_per_dataset: ceil(ceil(size · weight) · (1 + surplus)).
int64_t samples_per_dataset(int64_t split_size, double weight, double surplus);

// The dataset of each split (null for a split of size 0, and for a test split the sources give
// nothing). `sizes`: samples per split.
std::array<std::shared_ptr<const SplitDataset>, 3> build_gpt_datasets(
    const GptDataBuildOptions& options, const std::array<int64_t, 3>& sizes);

}  // namespace backend
