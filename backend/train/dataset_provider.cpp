// Megatron's dataset provider for pretrain_gpt; see dataset_provider.hpp.
#include "backend/train/dataset_provider.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ostream>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/small_file.hpp"
#include "backend/data/gpt_dataset_builder.hpp"
#include "backend/data/megatron_description.hpp"

namespace backend {

namespace {

std::optional<DataBlend> per_split_blend(const nlohmann::json& document, const char* key,
                                         const std::string& path) {
  if (!document.contains(key) || document[key].is_null()) return std::nullopt;
  const auto& entry = document[key];
  if (!entry.is_array() || entry.empty()) {
    common::fail("--per-split-data-args-path {}: \"{}\" must be a non-empty list of strings "
                 "(weight prefix ... or prefix ...)", path, key);
  }
  std::vector<std::string> words;
  for (const auto& word : entry) {
    if (word.is_string()) {
      words.push_back(word.get<std::string>());
    } else if (word.is_number()) {
      words.push_back(word.dump());
    } else {
      common::fail("--per-split-data-args-path {}: \"{}\" holds {}, not a string", path, key, word.dump());
    }
  }
  return blend_from_words(words, fmt::format("--per-split-data-args-path {} \"{}\"", path, key));
}

}  // namespace

std::array<int64_t, 3> train_valid_test_num_samples(const TrainingArguments& a) {
  const int64_t train =
      a.run.train_samples > 0 ? a.run.train_samples : a.run.train_iters * a.run.global_batch_size;
  const int64_t evaluations = a.run.train_iters / a.evaluation.eval_interval + 1;
  return {train, evaluations * a.evaluation.eval_iters * a.run.global_batch_size,
          a.evaluation.eval_iters * a.run.global_batch_size};
}

DataSources data_sources(const TrainingArguments& a) {
  DataSources sources;
  if (!a.data.data_path.empty()) sources.blend = blend_from_words(a.data.data_path, "--data-path");
  if (!a.data.data_args_path.empty()) sources.blend = read_data_args_file(a.data.data_args_path);
  if (!a.data.data_file_list.empty()) sources.blend = read_data_file_list(a.data.data_file_list);
  if (sources.blend) sources.split = a.data.split.empty() ? "969, 30, 1" : a.data.split;
  if (!a.data.train_data_path.empty()) {
    sources.blend_per_split[0] = blend_from_words(a.data.train_data_path, "--train-data-path");
  }
  if (!a.data.valid_data_path.empty()) {
    sources.blend_per_split[1] = blend_from_words(a.data.valid_data_path, "--valid-data-path");
  }
  if (!a.data.test_data_path.empty()) {
    sources.blend_per_split[2] = blend_from_words(a.data.test_data_path, "--test-data-path");
  }
  if (!a.data.per_split_data_args_path.empty()) {
    const std::string text =
        common::read_small_file(a.data.per_split_data_args_path, "--per-split-data-args-path");
    nlohmann::json document;
    try {
      document = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& error) {
      common::fail("--per-split-data-args-path {}: not JSON: {}", a.data.per_split_data_args_path,
                   error.what());
    }
    if (!document.is_object()) {
      common::fail(
          "--per-split-data-args-path {}: expected an object with \"train\", \"valid\" and "
          "\"test\" lists",
          a.data.per_split_data_args_path);
    }
    sources.blend_per_split[0] =
        per_split_blend(document, "train", a.data.per_split_data_args_path);
    sources.blend_per_split[1] =
        per_split_blend(document, "valid", a.data.per_split_data_args_path);
    sources.blend_per_split[2] = per_split_blend(document, "test", a.data.per_split_data_args_path);
  }
  return sources;
}

BatchSource build_dataset_batch_source(const TrainingArguments& a, int64_t vocab_size,
                                       std::ostream& out, bool* test_split_skipped) {
  const auto start = std::chrono::steady_clock::now();
  const std::array<int64_t, 3> sizes = train_valid_test_num_samples(a);
  out << "> building train, validation, and test datasets ...\n"
      << " > datasets target sizes (minimum size):\n"
      << fmt::format("    train:      {}\n", sizes[0])
      << fmt::format("    validation: {}\n", sizes[1])
      << fmt::format("    test:       {}\n", sizes[2])
      << "> building train, validation, and test datasets for GPT ...\n";
  out.flush();

  GptDataBuildOptions options;
  options.sources = data_sources(a);
  options.dataset.random_seed = static_cast<uint32_t>(a.run.seed);
  options.dataset.sequence_length = a.model.seq_length;
  // Megatron's tokenizer entry, so the cache names are Megatron's (megatron_description.hpp).
  options.dataset.tokenizer = megatron_tokenizer_identifiers(a.tokenizer);
  options.dataset.cache_path = a.data.data_cache_path;
  options.num_threads = a.data.num_dataset_builder_threads > 0
                            ? static_cast<int>(a.data.num_dataset_builder_threads)
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string train_reason = a.run.train_samples > 0
                                       ? fmt::format("--train-samples {}", a.run.train_samples)
                                       : fmt::format("--train-iters {} × --global-batch-size {}",
                                                     a.run.train_iters, a.run.global_batch_size);
  options.why_needed = {
      fmt::format("training reads {} samples ({})", sizes[0], train_reason),
      fmt::format("validation reads {} samples (--eval-iters {} global batches of {} at each of "
                  "{} evaluations); pass --eval-iters 0 to train without validation and test",
                  sizes[1], a.evaluation.eval_iters, a.run.global_batch_size,
                  a.run.train_iters / a.evaluation.eval_interval + 1),
      fmt::format("the final test reads {} samples (--eval-iters {} global batches of {}); pass "
                  "--eval-iters 0 to train without validation and test",
                  sizes[2], a.evaluation.eval_iters, a.run.global_batch_size)};
  const auto datasets = build_gpt_datasets(options, sizes);
  if (options.sources.blend && !options.sources.blend->corpora.empty()) {
    // The ALCF fork's per-corpus lines ("expected" weight); its samples are those of the one
    // blend, each dataset by its own weight (data_blend.hpp).
    const DataBlend& blend = *options.sources.blend;
    const auto shares =
        corpus_shares(blend, normalize_weights(*blend.weights, "--data-file-list weights"));
    spdlog::info("--data-file-list: {} datasets in {} corpora, each dataset sampled by its own "
                 "weight; the weight of each corpus:", blend.prefixes.size(), shares.size());
    for (const CorpusShare& share : shares) {
      spdlog::info("    {}: {} datasets, weight {:.6f}", share.name, share.datasets, share.weight);
    }
  }
  const bool no_test_split = sizes[2] > 0 && !datasets[2];
  if (test_split_skipped != nullptr) *test_split_skipped = no_test_split;
  if (no_test_split) {
    spdlog::info("test split: none ({}), so no test evaluation is run after training, as Megatron "
                 "skips an empty split",
                 options.sources.blend
                     ? fmt::format("--split {} gives it a share of 0", *options.sources.split)
                     : std::string("no test data is given: --test-data-path, or \"test\" in "
                                   "--per-split-data-args-path"));
  }

  static constexpr const char* kNames[] = {"train", "validation", "test"};
  for (size_t split = 0; split < 3; ++split) {
    if (!datasets[split]) continue;
    const auto& dataset = *datasets[split];
    if (dataset.blend()) {
      spdlog::info("{} split: a blend of {} datasets, {} samples", kNames[split],
                   dataset.blend()->datasets().size(), dataset.size());
    } else {
      spdlog::info("{} split: {} sequences [{}, {}), {} samples", kNames[split],
                   dataset.single()->prefix(), dataset.single()->begin(), dataset.single()->end(),
                   dataset.size());
    }
  }
  out << "> finished creating GPT datasets ...\n";
  spdlog::info("datasets ready in {:.3f} s",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  out.flush();

  return [datasets, sequence_length = a.model.seq_length, vocab_size](
             Split split, int64_t first_sample, int64_t batch_size, std::span<int32_t> tokens,
             std::span<int32_t> labels) {
    const auto& dataset = datasets[static_cast<size_t>(split)];
    if (!dataset) {
      common::fail("internal: the {} split was read but not built", kNames[static_cast<size_t>(split)]);
    }
    std::vector<int32_t> sample(static_cast<size_t>(sequence_length + 1));
    for (int64_t b = 0; b < batch_size; ++b) {
      dataset->sample(first_sample + b, sample);
      for (int32_t token : sample) {
        if (token >= vocab_size) {
          common::fail("sample {} of the {} split holds token id {}, but the tokenizer has {} ids: "
                       "the data was tokenized with another vocabulary; pass the --tokenizer-type, "
                       "--vocab-file or --vocab-size it was made with", first_sample + b,
                       kNames[static_cast<size_t>(split)], token, vocab_size);
        }
      }
      std::copy(sample.begin(), sample.end() - 1, tokens.begin() + b * sequence_length);
      std::copy(sample.begin() + 1, sample.end(), labels.begin() + b * sequence_length);
    }
  };
}

}  // namespace backend
