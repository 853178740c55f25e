// Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py, with helpers.cpp's
// build_sample_idx): training samples of seq_length + 1 tokens cut from the concatenation of a
// range of a .bin/.idx dataset's sequences, epoch after epoch, in a shuffled order.
//
//   tokens per epoch  T = Σ lengths of the range's sequences (a "document" here is a sequence,
//                     as in Megatron's GPT dataset, which splits by sequence)
//   epochs            the fewest E with E·T ≥ num_samples · seq_length + 1
//   final epoch       with E > 1, when the samples the last epoch must give are fewer than
//                     int(0.8 · samples per epoch), the last epoch is shuffled on its own
//                     (separate_final_epoch), so the few samples taken from it are not spread
//                     over the whole run
//   document index    the range's sequence ids repeated E times, shuffled (int32); with a
//                     separate final epoch, the first E−1 epochs and the last one shuffled apart
//   sample index      (E·T − 1) // seq_length + 1 rows of (position in the document index,
//                     token offset): sample j runs from row j to row j+1 inclusive of one extra
//                     token, so consecutive samples overlap by one token (labels = tokens
//                     shifted by one); int32 unless a value could exceed it, then int64
//   shuffle index     a permutation of the samples (uint32, int64 from 2^32 − 2 samples); with a
//                     separate final epoch the final epoch's samples are permuted apart, after
//                     the others
// Shuffles draw from numpy's RandomState(seed) (numpy_random.hpp): the document index, then
// the shuffle index, from one stream, so the arrays, and the sample order, are Megatron's.
//
// The three arrays are cached as .npy files in `<prefix>/cache/GPTDataset_indices/` (Megatron's
// default: a directory named after the dataset prefix) or in --data-cache-path, named
// `<md5 of the description>-GPTDataset-<split>-{description.txt,document_index.npy,
// sample_index.npy,shuffle_index.npy}`; a later run with the same description memory-maps them
// instead of building. The description is the JSON of what determines the arrays (Megatron's
// unique_identifiers: class, dataset_path, num_samples, index_split, random_seed,
// sequence_length, split, split_matrix, tokenizer), written byte for byte as Megatron writes it
// (megatron_description.hpp), so the names are Megatron's and a cache Megatron built is
// reused. Files are written under temporary names,
// renamed into place, the description last, so a crash never leaves a cache that looks whole.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/data/data_blend.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "backend/data/mock_dataset.hpp"
#include "backend/data/npy_file.hpp"
#include "backend/data/numpy_random.hpp"

namespace backend {

// Megatron's Split names: train, valid, test.
const char* megatron_split_name(Split split);

struct GptDatasetConfig {
  uint32_t random_seed = 1234;
  int64_t sequence_length = 0;
  std::optional<std::string> split;         // --split's text; none with per-split blends
  std::optional<SplitMatrix> split_matrix;  // from `split`
  nlohmann::ordered_json tokenizer;         // the tokenizer's entry in the description
                                            // (megatron_tokenizer_identifiers)
  std::string cache_path;                   // --data-cache-path; empty: next to each dataset
};

// ---- the index arrays, as pure functions (Megatron's algorithms)

struct EpochPlan {
  int64_t tokens_per_epoch = 0;
  int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // with a separate final epoch
};

// _get_num_epochs and the separate_final_epoch rule. `num_samples` none: one epoch.
EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                      int64_t sequence_length);

// _build_document_index.
std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& random, bool separate_final_epoch);

// build_sample_idx with drop_last_partial_sequence and add_extra_token_to_sequence: the
// (num_samples + 1) × 2 array, flattened. `sequence_lengths` are all of the dataset's.
template <typename T>
std::vector<T> build_sample_index(std::span<const int32_t> sequence_lengths,
                                  std::span<const int32_t> document_index, int64_t sequence_length,
                                  int64_t num_epochs, int64_t tokens_per_epoch);

// _build_shuffle_index: [0, num_samples) shuffled, then [num_samples, total_size) shuffled.
template <typename T>
std::vector<T> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& random);

// ---- the dataset

class GptDataset {
 public:
  // Sequences [begin, end) of `dataset` (stored under `prefix`), `num_samples` of them asked
  // for (none: one epoch), as split `split`. Builds the index arrays or loads them from the
  // cache. An empty range (or one without tokens) gives a dataset of no samples, not cached.
  GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::string prefix, int64_t begin,
             int64_t end, std::optional<int64_t> num_samples, Split split,
             const GptDatasetConfig& config);

  // Samples available (at least num_samples unless the range is empty).
  int64_t size() const { return size_; }
  // Writes sample `index` (after the shuffle): sequence_length + 1 tokens.
  void sample(int64_t index, std::span<int32_t> out) const;

  const std::string& prefix() const { return prefix_; }
  Split split() const { return split_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  std::optional<int64_t> num_samples() const { return num_samples_; }
  const nlohmann::ordered_json& unique_identifiers() const { return identifiers_; }
  const std::string& description_hash() const { return hash_; }
  // True when this run built the arrays, false when they came from the cache.
  bool built_anew() const { return built_anew_; }
  const std::string& cache_directory() const { return cache_directory_; }

 private:
  bool load_cache(const std::string& base, const std::string& description);

  std::shared_ptr<const IndexedDataset> dataset_;
  std::string prefix_;
  int64_t begin_ = 0, end_ = 0;
  std::optional<int64_t> num_samples_;
  Split split_;
  int64_t sequence_length_ = 0;
  nlohmann::ordered_json identifiers_;
  std::string hash_, cache_directory_;
  bool built_anew_ = false;
  int64_t size_ = 0;
  std::optional<NpyArray> document_index_, sample_index_, shuffle_index_;
};

}  // namespace backend
