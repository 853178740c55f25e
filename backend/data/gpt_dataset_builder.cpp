// Megatron's dataset builder for GPT; see gpt_dataset_builder.hpp.
#include "backend/data/gpt_dataset_builder.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "backend/common/error.hpp"

namespace backend {

namespace {

constexpr std::array<Split, 3> kSplits = {Split::train, Split::validation, Split::test};
constexpr size_t kTestSplit = 2;

const char* split_title(size_t split) {
  static constexpr const char* kTitles[] = {"training", "validation", "test"};
  return kTitles[split];
}

std::shared_ptr<const IndexedDataset> open_dataset(const std::string& prefix) {
  for (const char* extension : {".bin", ".idx"}) {
    if (prefix.ends_with(extension) && !std::filesystem::exists(index_file_path(prefix))) {
      common::fail("dataset prefix {} ends in {}: give the prefix without the extension, e.g. {}",
                   prefix, extension, prefix.substr(0, prefix.size() - 4));
    }
  }
  auto dataset = std::make_shared<const IndexedDataset>(prefix);
  if (dataset->dtype() == DType::float32 || dataset->dtype() == DType::float64) {
    common::fail("{}: its dtype {} does not hold token ids (a GPT dataset needs an integer dtype, "
                 "as preprocess_data writes)", index_file_path(prefix), dtype_name(dataset->dtype()));
  }
  return dataset;
}

// Runs task(0) .. task(count − 1) on up to `threads` threads; the first failure (by index)
// is rethrown after all have finished.
template <typename Task>
void run_parallel(size_t count, int threads, const Task& task) {
  std::vector<std::exception_ptr> failures(count);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) {
      try {
        task(i);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    }
  };
  const size_t workers = std::min<size_t>(count, static_cast<size_t>(std::max(1, threads)));
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

// What one split of one prefix selects and asks for.
struct MidLevelRequest {
  bool build = false;
  std::optional<std::pair<double, double>> fractions;  // none: the whole dataset
  std::optional<int64_t> num_samples;
  bool operator==(const MidLevelRequest&) const = default;
};

}  // namespace

int64_t samples_per_dataset(int64_t split_size, double weight, double surplus) {
  const double target = std::ceil(static_cast<double>(split_size) * weight);
  return static_cast<int64_t>(std::ceil(target * (1 + surplus)));
}

std::array<std::shared_ptr<const SplitDataset>, 3> build_gpt_datasets(
    const GptDataBuildOptions& options, const std::array<int64_t, 3>& sizes) {
  std::array<std::shared_ptr<const SplitDataset>, 3> result;
  const DataSources& sources = options.sources;
  GptDatasetConfig config = options.dataset;

  auto fail_empty_split = [&](size_t split, const std::string& what) {
    common::fail("{}, so the {} split has no data: {}", what, split_title(split),
                 options.why_needed[split]);
  };

  // Builds the GPT datasets of `prefixes` for the splits in `requests[d][split]`, in parallel,
  // one task per distinct prefix. A blend may name a prefix more than once; its identical
  // requests then share one dataset, so no two tasks ever build (and write the cache files
  // of) the same dataset at once. Megatron builds each occurrence; the arrays are the same.
  auto build_mid_level = [&](const std::vector<std::string>& prefixes,
                             const std::vector<std::array<MidLevelRequest, 3>>& requests) {
    std::vector<std::array<std::shared_ptr<const GptDataset>, 3>> datasets(prefixes.size());
    std::map<std::string, size_t> task_of_prefix;
    std::vector<std::vector<size_t>> occurrences;  // per task, the positions of its prefix
    for (size_t d = 0; d < prefixes.size(); ++d) {
      const auto [found, added] = task_of_prefix.try_emplace(prefixes[d], occurrences.size());
      if (added) occurrences.emplace_back();
      occurrences[found->second].push_back(d);
    }
    run_parallel(occurrences.size(), options.num_threads, [&](size_t task) {
      const std::vector<size_t>& positions = occurrences[task];
      const auto indexed = open_dataset(prefixes[positions.front()]);
      for (size_t split = 0; split < 3; ++split) {
        for (size_t i = 0; i < positions.size(); ++i) {
          const size_t d = positions[i];
          const MidLevelRequest& request = requests[d][split];
          if (!request.build) continue;
          const auto same = std::find_if(positions.begin(), positions.begin() + static_cast<std::ptrdiff_t>(i),
                                         [&](size_t e) { return requests[e][split] == request; });
          if (same != positions.begin() + static_cast<std::ptrdiff_t>(i)) {
            datasets[d][split] = datasets[*same][split];
            continue;
          }
          auto [begin, end] = request.fractions
                                  ? split_range(*request.fractions, indexed->sequence_count())
                                  : std::pair<int64_t, int64_t>{0, indexed->sequence_count()};
          datasets[d][split] = std::make_shared<const GptDataset>(
              indexed, prefixes[d], begin, end, request.num_samples, kSplits[split], config);
        }
      }
    });
    return datasets;
  };

  // A dataset a split reads from must have tokens.
  auto require_tokens = [&](const GptDataset& dataset, size_t split, const std::string& range_source) {
    if (dataset.size() > 0) return;
    fail_empty_split(split, fmt::format("{} gives the {} split sequences [{}, {}) of {}, which hold "
                                        "no tokens", range_source, split_title(split),
                                        dataset.begin(), dataset.end(), dataset.prefix()));
  };

  // A blend of `datasets` (one per prefix) for one split: Megatron's top-level dataset.
  auto blend_split = [&](size_t split, const std::vector<std::shared_ptr<const GptDataset>>& datasets,
                         const std::optional<std::vector<double>>& weights,
                         const std::string& range_source) -> std::shared_ptr<const SplitDataset> {
    std::vector<double> blend_weights;
    int64_t size = 0;
    if (weights) {
      for (size_t d = 0; d < datasets.size(); ++d) {
        const int64_t target = static_cast<int64_t>(std::ceil(static_cast<double>(sizes[split]) * (*weights)[d]));
        if (target > 0) require_tokens(*datasets[d], split, range_source);
        size += target;
      }
      blend_weights = *weights;
    } else {
      for (const auto& dataset : datasets) {
        blend_weights.push_back(static_cast<double>(dataset->size()));
        size += dataset->size();
      }
      if (size == 0) {
        fail_empty_split(split, fmt::format("{} leaves every dataset of the blend without tokens in "
                                            "the {} split", range_source, split_title(split)));
      }
      size = std::min(sizes[split], size);
    }
    return std::make_shared<const SplitDataset>(
        std::make_shared<const BlendedDataset>(datasets, blend_weights, size, config.cache_path));
  };

  if (sources.blend) {
    const DataBlend& blend = *sources.blend;
    const std::string split_text = sources.split.value_or("969, 30, 1");
    config.split = split_text;
    config.split_matrix = split_matrix_from_vector(parse_split(split_text));
    const std::string range_source = fmt::format("--split {}", split_text);
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize_weights(*blend.weights, "--data-path weights");

    std::vector<std::array<MidLevelRequest, 3>> requests(blend.prefixes.size());
    for (size_t split = 0; split < 3; ++split) {
      if (sizes[split] == 0) continue;
      const auto& fractions = (*config.split_matrix)[split];
      if (!fractions && split == kTestSplit) continue;  // skipped, as Megatron skips it
      if (!fractions) {
        fail_empty_split(split, fmt::format("--split {} gives the {} split a share of 0", split_text,
                                            split_title(split)));
      }
      for (size_t d = 0; d < blend.prefixes.size(); ++d) {
        MidLevelRequest& request = requests[d][split];
        request.build = true;
        request.fractions = fractions;
        if (weights) {
          request.num_samples = samples_per_dataset(sizes[split], (*weights)[d], kMidLevelDatasetSurplus);
        } else if (blend.prefixes.size() == 1) {
          request.num_samples = sizes[split];
        }
      }
    }
    const auto datasets = build_mid_level(blend.prefixes, requests);
    for (size_t split = 0; split < 3; ++split) {
      if (sizes[split] == 0 || !(*config.split_matrix)[split]) continue;
      if (blend.prefixes.size() == 1 && !weights) {
        require_tokens(*datasets[0][split], split, range_source);
        result[split] = std::make_shared<const SplitDataset>(datasets[0][split]);
        continue;
      }
      std::vector<std::shared_ptr<const GptDataset>> members;
      for (const auto& per_prefix : datasets) members.push_back(per_prefix[split]);
      result[split] = blend_split(split, members, weights, range_source);
    }
    return result;
  }

  // A blend per split: each split's data is its own, wholly.
  config.split.reset();
  config.split_matrix.reset();
  static constexpr const char* kFlags[] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (size_t split = 0; split < 3; ++split) {
    if (sizes[split] == 0) continue;
    const auto& blend = sources.blend_per_split[split];
    if (!blend && split == kTestSplit) continue;  // skipped, as Megatron skips it
    if (!blend) {
      fail_empty_split(split, fmt::format("no {} is given", kFlags[split]));
    }
    const std::string range_source = kFlags[split];
    std::optional<std::vector<double>> weights;
    if (blend->weights) weights = normalize_weights(*blend->weights, std::string(kFlags[split]) + " weights");
    std::vector<std::array<MidLevelRequest, 3>> requests(blend->prefixes.size());
    for (size_t d = 0; d < blend->prefixes.size(); ++d) {
      MidLevelRequest& request = requests[d][split];
      request.build = true;
      if (blend->prefixes.size() == 1) {
        request.num_samples = sizes[split];
      } else if (weights) {
        request.num_samples = samples_per_dataset(sizes[split], (*weights)[d], kMidLevelDatasetSurplus);
      }
    }
    const auto datasets = build_mid_level(blend->prefixes, requests);
    if (blend->prefixes.size() == 1) {
      require_tokens(*datasets[0][split], split, range_source);
      result[split] = std::make_shared<const SplitDataset>(datasets[0][split]);
      continue;
    }
    std::vector<std::shared_ptr<const GptDataset>> members;
    for (const auto& per_prefix : datasets) members.push_back(per_prefix[split]);
    result[split] = blend_split(split, members, weights, range_source);
  }
  return result;
}

}  // namespace backend
