// Megatron's GPTDataset index building and sample reading; see gpt_dataset.hpp. The algorithms
// follow megatron/core/datasets/gpt_dataset.py (_get_num_epochs, the separate_final_epoch rule,
// _build_document_index, _build_shuffle_index) and helpers.cpp (build_sample_idx).
#include "backend/data/gpt_dataset.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>

#include "backend/common/durable_file.hpp"
#include "backend/common/error.hpp"
#include "backend/common/md5.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/megatron_description.hpp"

namespace backend {

namespace {

constexpr double kSeparateFinalEpochThreshold = 0.80;

// The split matrix as Megatron's description holds it. Megatron's bookends are [0, 0 + s0,
// ...]: only the first is the int 0 (json writes `0`); later ones are floats, so a zero start of
// the second split, after an empty first one, is written `0.0`.
nlohmann::ordered_json split_matrix_json(const std::optional<SplitMatrix>& matrix) {
  if (!matrix) return nullptr;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < matrix->size(); ++i) {
    const auto& row = (*matrix)[i];
    if (!row) {
      rows.push_back(nullptr);
      continue;
    }
    nlohmann::ordered_json pair = nlohmann::ordered_json::array();
    if (i == 0 && row->first == 0.0) {
      pair.push_back(0);
    } else {
      pair.push_back(row->first);
    }
    pair.push_back(row->second);
    rows.push_back(pair);
  }
  return rows;
}

}  // namespace

const char* megatron_split_name(Split split) {
  switch (split) {
    case Split::train: return "train";
    case Split::validation: return "valid";
    case Split::test: return "test";
  }
  return "train";
}

EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
                      int64_t sequence_length) {
  EpochPlan plan;
  plan.tokens_per_epoch = tokens_per_epoch;
  if (!num_samples) return plan;
  if (tokens_per_epoch <= 0) common::fail("internal: planning epochs over no tokens");
  // The fewest epochs whose tokens cover num_samples samples of seq_length + 1 tokens that
  // overlap by one (Megatron adds epochs one at a time until they do).
  const int64_t requested = *num_samples * sequence_length + 1;
  plan.num_epochs = std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
  if (plan.num_epochs == 1) return plan;
  plan.num_samples_sans_final_epoch =
      ((plan.num_epochs - 1) * tokens_per_epoch - 1) / sequence_length;
  const int64_t from_final_epoch = *num_samples - plan.num_samples_sans_final_epoch;
  const int64_t per_epoch = (tokens_per_epoch - 1) / sequence_length;
  if (from_final_epoch < 0 || from_final_epoch > per_epoch + 1) {
    common::fail("internal: {} samples from the final epoch of {} (Megatron's assertion)",
                 from_final_epoch, per_epoch);
  }
  plan.separate_final_epoch =
      from_final_epoch <
      static_cast<int64_t>(kSeparateFinalEpochThreshold * static_cast<double>(per_epoch));
  return plan;
}

std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs,
                                          NumpyRandomState& random, bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> index;
    index.reserve(documents.size() * static_cast<size_t>(num_epochs));
    for (int64_t epoch = 0; epoch < num_epochs; ++epoch) {
      index.insert(index.end(), documents.begin(), documents.end());
    }
    random.shuffle(std::span<int32_t>(index));
    return index;
  }
  std::vector<int32_t> index = build_document_index(documents, num_epochs - 1, random, false);
  const std::vector<int32_t> last = build_document_index(documents, 1, random, false);
  index.insert(index.end(), last.begin(), last.end());
  return index;
}

template <typename T>
std::vector<T> build_sample_index(std::span<const int32_t> sequence_lengths,
                                  std::span<const int32_t> document_index, int64_t sequence_length,
                                  int64_t num_epochs, int64_t tokens_per_epoch) {
  const int64_t num_samples = (num_epochs * tokens_per_epoch - 1) / sequence_length;
  std::vector<T> index(static_cast<size_t>(2 * (num_samples + 1)));
  const auto last_position = static_cast<int64_t>(document_index.size()) - 1;
  int64_t position = 0;  // into the document index
  int64_t offset = 0;    // token offset within that document
  index[0] = 0;
  index[1] = 0;
  for (int64_t sample = 1; sample <= num_samples; ++sample) {
    // A fresh sample of seq_length + 1 tokens; its last token is the next sample's first.
    int64_t remaining = sequence_length + 1;
    while (remaining != 0) {
      const int64_t length = sequence_lengths[static_cast<size_t>(document_index[static_cast<size_t>(position)])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - 1;
        remaining = 0;
      } else {
        if (position == last_position) {
          // The documents ran out (only without drop_last_partial_sequence in Megatron).
          offset = sequence_lengths[static_cast<size_t>(document_index[static_cast<size_t>(position)])] - 1;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    index[static_cast<size_t>(2 * sample)] = static_cast<T>(position);
    index[static_cast<size_t>(2 * sample + 1)] = static_cast<T>(offset);
  }
  return index;
}

template std::vector<int32_t> build_sample_index<int32_t>(std::span<const int32_t>, std::span<const int32_t>,
                                                          int64_t, int64_t, int64_t);
template std::vector<int64_t> build_sample_index<int64_t>(std::span<const int32_t>, std::span<const int32_t>,
                                                          int64_t, int64_t, int64_t);

template <typename T>
std::vector<T> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& random) {
  std::vector<T> index(static_cast<size_t>(total_size));
  for (int64_t i = 0; i < total_size; ++i) index[static_cast<size_t>(i)] = static_cast<T>(i);
  random.shuffle(std::span<T>(index.data(), static_cast<size_t>(num_samples)));
  if (num_samples < total_size) {
    random.shuffle(std::span<T>(index.data() + num_samples, static_cast<size_t>(total_size - num_samples)));
  }
  return index;
}

template std::vector<uint32_t> build_shuffle_index<uint32_t>(int64_t, int64_t, NumpyRandomState&);
template std::vector<int64_t> build_shuffle_index<int64_t>(int64_t, int64_t, NumpyRandomState&);

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::string prefix,
                       int64_t begin, int64_t end, std::optional<int64_t> num_samples, Split split,
                       const GptDatasetConfig& config)
    : dataset_(std::move(dataset)),
      prefix_(std::move(prefix)),
      begin_(begin),
      end_(end),
      num_samples_(num_samples),
      split_(split),
      sequence_length_(config.sequence_length) {
  if (begin < 0 || begin > end || end > dataset_->sequence_count()) {
    common::fail("internal: sequences [{}, {}) of {}, which has {}", begin, end, prefix_,
                 dataset_->sequence_count());
  }
  if (dataset_->sequence_count() > std::numeric_limits<int32_t>::max()) {
    common::fail("{}: {} sequences; Megatron's GPT dataset indexes them with int32 (at most {})",
                 prefix_, dataset_->sequence_count(), std::numeric_limits<int32_t>::max());
  }
  identifiers_["class"] = "GPTDataset";
  identifiers_["dataset_path"] = prefix_;
  identifiers_["num_samples"] = num_samples ? nlohmann::ordered_json(*num_samples) : nullptr;
  identifiers_["index_split"] = megatron_split_name(split);
  identifiers_["random_seed"] = config.random_seed;
  identifiers_["sequence_length"] = config.sequence_length;
  identifiers_["split"] = config.split ? nlohmann::ordered_json(*config.split) : nullptr;
  identifiers_["split_matrix"] = split_matrix_json(config.split_matrix);
  identifiers_["tokenizer"] = config.tokenizer;
  const std::string description = python_json_text(identifiers_);
  hash_ = common::md5_hex(description);

  int64_t tokens_per_epoch = 0;
  for (int64_t i = begin; i < end; ++i) tokens_per_epoch += dataset_->sequence_length(i);
  if (tokens_per_epoch == 0) return;  // nothing to sample; the builder decides if that is an error

  cache_directory_ = config.cache_path.empty() ? prefix_ + "/cache/GPTDataset_indices" : config.cache_path;
  const std::string base =
      (std::filesystem::path(cache_directory_) / fmt::format("{}-GPTDataset-{}", hash_, megatron_split_name(split)))
          .string();
  if (load_cache(base, description)) {
    spdlog::info("Load the GPTDataset {} indices of {} from {}-*.npy: {} samples",
                 megatron_split_name(split), prefix_, base, size_);
    return;
  }

  const auto start = std::chrono::steady_clock::now();
  std::error_code error;
  std::filesystem::create_directories(cache_directory_, error);
  if (error) {
    common::fail("cannot create the index cache directory {} for {}: {}; pass --data-cache-path DIR "
                 "(a writable directory) to keep the indices there instead",
                 cache_directory_, prefix_, error.message());
  }
  const EpochPlan plan = plan_epochs(tokens_per_epoch, num_samples, sequence_length_);
  NumpyRandomState random(config.random_seed);

  std::vector<int32_t> documents(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) documents[static_cast<size_t>(i - begin)] = static_cast<int32_t>(i);
  const std::vector<int32_t> document_index =
      build_document_index(documents, plan.num_epochs, random, plan.separate_final_epoch);
  documents = {};

  std::vector<int32_t> lengths(static_cast<size_t>(dataset_->sequence_count()));
  int64_t longest = 0;
  for (int64_t i = 0; i < dataset_->sequence_count(); ++i) {
    lengths[static_cast<size_t>(i)] = dataset_->sequence_length(i);
    longest = std::max<int64_t>(longest, lengths[static_cast<size_t>(i)]);
  }
  auto write = [&](const char* name, auto&& values, std::vector<int64_t> shape) {
    using Value = typename std::decay_t<decltype(values)>::value_type;
    try {
      write_npy<Value>(base + "-" + name, std::span<const Value>(values), shape);
    } catch (const common::Error& failure) {
      common::fail("cannot write the index cache for {}: {}; pass --data-cache-path DIR (a writable "
                   "directory) to keep the indices there instead", prefix_, failure.what());
    }
  };
  write("document_index.npy", document_index, {static_cast<int64_t>(document_index.size())});

  // Megatron's build_sample_idx picks int32 when every value fits.
  int64_t rows = 0;
  const int64_t largest = std::max<int64_t>(static_cast<int64_t>(document_index.size()), longest);
  if (largest <= std::numeric_limits<int32_t>::max()) {
    const auto index = build_sample_index<int32_t>(lengths, document_index, sequence_length_,
                                                   plan.num_epochs, tokens_per_epoch);
    rows = static_cast<int64_t>(index.size() / 2);
    write("sample_index.npy", index, {rows, 2});
  } else {
    const auto index = build_sample_index<int64_t>(lengths, document_index, sequence_length_,
                                                   plan.num_epochs, tokens_per_epoch);
    rows = static_cast<int64_t>(index.size() / 2);
    write("sample_index.npy", index, {rows, 2});
  }
  lengths = {};

  const int64_t total = rows - 1;
  const int64_t first = plan.separate_final_epoch ? plan.num_samples_sans_final_epoch : total;
  if (total >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1) {
    write("shuffle_index.npy", build_shuffle_index<int64_t>(first, total, random), {total});
  } else {
    write("shuffle_index.npy", build_shuffle_index<uint32_t>(first, total, random), {total});
  }
  try {
    common::write_text_file_atomically(base + "-description.txt", description);
  } catch (const common::Error& failure) {
    common::fail("cannot write the index cache for {}: {}; pass --data-cache-path DIR (a writable "
                 "directory) to keep the indices there instead", prefix_, failure.what());
  }
  if (!load_cache(base, description)) {
    common::fail("the index cache {}-* just written for {} cannot be read back", base, prefix_);
  }
  built_anew_ = true;
  spdlog::info("Build and save the GPTDataset {} indices of {}: {} samples, {} epochs{}, {:.3f} s",
               megatron_split_name(split), prefix_, size_, plan.num_epochs,
               plan.separate_final_epoch ? " (the last shuffled separately)" : "",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

bool GptDataset::load_cache(const std::string& base, const std::string& description) {
  const auto stored = common::read_small_file_if_exists(base + "-description.txt",
                                                        "the GPTDataset index cache description");
  if (!stored) return false;
  if (*stored != description) {
    spdlog::warn("{}-description.txt describes another dataset than {} (an MD5 collision or an "
                 "edited file); building the indices again", base, prefix_);
    return false;
  }
  try {
    NpyArray documents(base + "-document_index.npy");
    NpyArray samples(base + "-sample_index.npy");
    NpyArray shuffle(base + "-shuffle_index.npy");
    const auto fail_shape = [&](const NpyArray& array, const char* expected) {
      common::fail("{}: {} of shape ({}) is not {}", array.path().string(), npy_descr(array.element()),
                   fmt::join(array.shape(), ", "), expected);
    };
    if (documents.element() != NpyElement::int32 || documents.shape().size() != 1) {
      fail_shape(documents, "a 1-D int32 document index");
    }
    if ((samples.element() != NpyElement::int32 && samples.element() != NpyElement::int64) ||
        samples.shape().size() != 2 || samples.shape()[1] != 2 || samples.shape()[0] < 1) {
      fail_shape(samples, "an (N + 1, 2) int32 or int64 sample index");
    }
    const int64_t total = samples.shape()[0] - 1;
    if ((shuffle.element() != NpyElement::uint32 && shuffle.element() != NpyElement::int64) ||
        shuffle.shape().size() != 1 || shuffle.size() != total) {
      fail_shape(shuffle, fmt::format("a permutation of the sample index's {} samples", total).c_str());
    }
    document_index_ = std::move(documents);
    sample_index_ = std::move(samples);
    shuffle_index_ = std::move(shuffle);
    size_ = total;
  } catch (const common::Error& failure) {
    spdlog::warn("the cached indices {}-* are unusable ({}); building them again", base, failure.what());
    return false;
  }
  return true;
}

void GptDataset::sample(int64_t index, std::span<int32_t> out) const {
  if (index < 0 || index >= size_) {
    common::fail("sample {} of the {} split of {} does not exist (it has {} samples)", index,
                 megatron_split_name(split_), prefix_, size_);
  }
  if (static_cast<int64_t>(out.size()) != sequence_length_ + 1) {
    common::fail("internal: a sample buffer of {} tokens for seq_length {} + 1", out.size(), sequence_length_);
  }
  const int64_t shuffled = (*shuffle_index_)[index];
  const NpyArray& rows = *sample_index_;
  if (shuffled < 0 || shuffled >= size_) {
    common::fail("{}: entry {} is {}, outside [0, {}): the cache is corrupt; delete it to rebuild",
                 shuffle_index_->path().string(), index, shuffled, size_);
  }
  const int64_t first = rows[2 * shuffled], first_offset = rows[2 * shuffled + 1];
  const int64_t last = rows[2 * shuffled + 2], last_offset = rows[2 * shuffled + 3];
  if (first < 0 || last < first || last >= document_index_->size()) {
    common::fail("{}: rows {} and {} point outside the document index: the cache is corrupt; "
                 "delete it to rebuild", sample_index_->path().string(), shuffled, shuffled + 1);
  }
  int64_t filled = 0;
  for (int64_t position = first; position <= last; ++position) {
    const int64_t sequence = (*document_index_)[position];
    if (sequence < 0 || sequence >= dataset_->sequence_count()) {
      common::fail("{}: entry {} is sequence {}, but {} has {}: the cache is corrupt; delete it to "
                   "rebuild", document_index_->path().string(), position, sequence, prefix_,
                   dataset_->sequence_count());
    }
    const int64_t offset = position == first ? first_offset : 0;
    const int64_t length = position < last ? dataset_->sequence_length(sequence) - offset
                                           : last_offset + 1 - offset;
    if (length < 0 || filled + length > static_cast<int64_t>(out.size())) {
      common::fail("{}: sample {} does not hold seq_length + 1 = {} tokens: the cache is corrupt; "
                   "delete it to rebuild", sample_index_->path().string(), shuffled, out.size());
    }
    dataset_->read_tokens(sequence, offset, out.subspan(static_cast<size_t>(filled), static_cast<size_t>(length)));
    filled += length;
  }
  if (filled != static_cast<int64_t>(out.size())) {
    common::fail("{}: sample {} holds {} tokens instead of seq_length + 1 = {}: the cache is "
                 "corrupt; delete it to rebuild", sample_index_->path().string(), shuffled, filled,
                 out.size());
  }
}

}  // namespace backend
