// Megatron's dataset builder for GPT: split ranges, the per-dataset sample counts of a weighted
// blend (0.5 % surplus), blends without weights, per-split data, parallel building, and the
// errors that replace Megatron's assertions.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/gpt_dataset_builder.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;
using test_support::random_lengths;
using test_support::TemporaryDirectory;
using test_support::write_fixture_dataset;

namespace {

struct Corpus {
  TemporaryDirectory directory;
  std::vector<std::string> prefixes;
  explicit Corpus(std::vector<int> sequence_counts) {
    for (size_t i = 0; i < sequence_counts.size(); ++i) {
      prefixes.push_back((directory.path / fmt::format("shard{}_text_document", i)).string());
      write_fixture_dataset(prefixes.back(), random_lengths(sequence_counts[i], 5, 40, 100 + i));
    }
  }
};

GptDataBuildOptions options_for(DataSources sources, int threads = 2) {
  GptDataBuildOptions options;
  options.sources = std::move(sources);
  options.dataset.sequence_length = 16;
  options.dataset.tokenizer = {{"class", "NullTokenizer"}, {"vocab_size", 65001}};
  options.num_threads = threads;
  options.why_needed = {"WHY-TRAIN", "WHY-VALID", "WHY-TEST"};
  return options;
}

DataSources blend_of(std::vector<std::string> words, std::string split) {
  DataSources sources;
  sources.blend = blend_from_words(words, "--data-path");
  sources.split = std::move(split);
  return sources;
}

}  // namespace

TEST_CASE("one prefix: each split a contiguous range of the sequences") {
  Corpus corpus({100});
  const auto datasets = build_gpt_datasets(options_for(blend_of({corpus.prefixes[0]}, "90,5,5")), {50, 8, 4});
  REQUIRE(datasets[0]);
  REQUIRE(datasets[0]->single());
  CHECK(datasets[0]->single()->begin() == 0);
  CHECK(datasets[0]->single()->end() == 90);
  CHECK(datasets[1]->single()->begin() == 90);
  CHECK(datasets[1]->single()->end() == 95);
  CHECK(datasets[2]->single()->begin() == 95);
  CHECK(datasets[2]->single()->end() == 100);
  CHECK(datasets[0]->single()->num_samples() == 50);
  CHECK(datasets[1]->size() >= 8);
  // A split the run does not read is not built.
  const auto train_only = build_gpt_datasets(options_for(blend_of({corpus.prefixes[0]}, "90,5,5")), {50, 0, 0});
  CHECK_FALSE(train_only[1]);
  CHECK_FALSE(train_only[2]);
}

TEST_CASE("a weighted blend asks each dataset for ceil(ceil(N · w) · 1.005) samples") {
  CHECK(samples_per_dataset(1000, 0.3, kMidLevelDatasetSurplus) == 302);  // ceil(300 · 1.005)
  CHECK(samples_per_dataset(1000, 0.7, kMidLevelDatasetSurplus) == 704);  // ceil(703.5)
  CHECK(samples_per_dataset(0, 0.7, kMidLevelDatasetSurplus) == 0);
  CHECK(samples_per_dataset(3, 0.5, kMidLevelDatasetSurplus) == 3);       // ceil(ceil(1.5) · 1.005) = ceil(2.01)

  Corpus corpus({300, 400});
  const auto datasets = build_gpt_datasets(
      options_for(blend_of({"3", corpus.prefixes[0], "7", corpus.prefixes[1]}, "98,2,0")), {1000, 20, 0});
  REQUIRE(datasets[0]);
  const auto& blend = *datasets[0]->blend();
  CHECK(blend.size() == 1000);  // 300 + 700
  CHECK(blend.datasets()[0]->num_samples() == 302);
  CHECK(blend.datasets()[1]->num_samples() == 704);
  CHECK(blend.weights() == std::vector<double>{0.3, 0.7});
  CHECK(blend.datasets()[0]->end() == 294);  // round(0.98 · 300)
  // Validation: 20 · 0.3 = 6 and 20 · 0.7 = 14 → blend of 20; each dataset asks for
  // ceil(6 · 1.005) = 7 and ceil(14 · 1.005) = 15.
  CHECK(datasets[1]->size() == 20);
  CHECK(datasets[1]->blend()->datasets()[1]->num_samples() == 15);
  CHECK_FALSE(datasets[2]);

  // The same blend built by one thread: the same datasets, the same samples.
  const auto serial = build_gpt_datasets(
      options_for(blend_of({"3", corpus.prefixes[0], "7", corpus.prefixes[1]}, "98,2,0"), 1), {1000, 20, 0});
  CHECK(serial[0]->blend()->description_hash() == blend.description_hash());
  std::vector<int32_t> a(17), b(17);
  for (int64_t i = 0; i < 1000; i += 37) {
    datasets[0]->sample(i, a);
    serial[0]->sample(i, b);
    CHECK(a == b);
  }
}

TEST_CASE("prefixes without weights: one epoch each, blended by their sample counts") {
  Corpus corpus({200, 100});
  const auto datasets = build_gpt_datasets(options_for(blend_of({corpus.prefixes[0], corpus.prefixes[1]}, "1")),
                                           {100000, 0, 0});
  const auto& blend = *datasets[0]->blend();
  CHECK_FALSE(blend.datasets()[0]->num_samples().has_value());
  const int64_t total = blend.datasets()[0]->size() + blend.datasets()[1]->size();
  CHECK(blend.size() == total);  // min(100000, the samples there are)
  CHECK(blend.weights()[0] == static_cast<double>(blend.datasets()[0]->size()) / static_cast<double>(total));
}

TEST_CASE("per-split data: each split reads its own datasets whole") {
  Corpus corpus({50, 30, 20});
  DataSources sources;
  sources.blend_per_split[0] = blend_from_words(std::vector<std::string>{"0.9", corpus.prefixes[0]}, "--train-data-path");
  sources.blend_per_split[1] = blend_from_words(std::vector<std::string>{corpus.prefixes[1], corpus.prefixes[2]}, "--valid-data-path");
  const auto datasets = build_gpt_datasets(options_for(sources), {40, 16, 0});
  REQUIRE(datasets[0]->single());  // one prefix: its weight is ignored, as Megatron does
  CHECK(datasets[0]->single()->begin() == 0);
  CHECK(datasets[0]->single()->end() == 50);
  CHECK(datasets[0]->single()->unique_identifiers()["split"].is_null());
  REQUIRE(datasets[1]->blend());
  CHECK(datasets[1]->size() == 16);
  CHECK_FALSE(datasets[2]);

  // A test pass without test data is skipped, as Megatron skips it: no dataset, no error.
  const auto without_test = build_gpt_datasets(options_for(sources), {40, 16, 8});
  CHECK(without_test[0]);
  CHECK(without_test[1]);
  CHECK_FALSE(without_test[2]);
  // Not so the validation split.
  sources.blend_per_split[1].reset();
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(sources), {40, 16, 8}),
                       doctest::Contains("no --valid-data-path is given, so the validation split has no data: WHY-VALID"),
                       common::Error);
}

TEST_CASE("a split the run reads but the data leaves empty says why it is needed") {
  Corpus corpus({100, 3});
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(blend_of({corpus.prefixes[0]}, "100,0,0")), {10, 8, 0}),
                       doctest::Contains("--split 100,0,0 gives the validation split a share of 0, so the "
                                         "validation split has no data: WHY-VALID"),
                       common::Error);
  // 949,50,1 of 3 sequences gives validation round(2.847) .. round(2.997), nothing.
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(blend_of({corpus.prefixes[1]}, "949,50,1")), {10, 4, 4}),
                       doctest::Contains(("gives the validation split sequences [3, 3) of " + corpus.prefixes[1]).c_str()),
                       common::Error);
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(blend_of({"1", corpus.prefixes[0], "1", corpus.prefixes[1]},
                                                               "949,50,1")), {10, 4, 4}),
                       doctest::Contains("WHY-VALID"), common::Error);
  // The same split is fine when the run reads no test samples.
  CHECK_NOTHROW(build_gpt_datasets(options_for(blend_of({corpus.prefixes[1]}, "949,50,1")), {10, 0, 0}));
  // A test share of 0 (--split 98,2,0) leaves the test split out, as Megatron does; a blend too.
  const auto no_test = build_gpt_datasets(options_for(blend_of({corpus.prefixes[0]}, "98,2,0")), {10, 4, 4});
  CHECK(no_test[0]);
  CHECK(no_test[1]);
  CHECK_FALSE(no_test[2]);
  const auto blend_no_test = build_gpt_datasets(
      options_for(blend_of({"1", corpus.prefixes[0], "1", corpus.prefixes[0]}, "90,10,0")), {10, 4, 4});
  CHECK(blend_no_test[1]);
  CHECK_FALSE(blend_no_test[2]);
}

TEST_CASE("bad prefixes and datasets are named") {
  Corpus corpus({10});
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(blend_of({corpus.prefixes[0] + ".bin"}, "1")), {1, 0, 0}),
                       doctest::Contains("ends in .bin: give the prefix without the extension"), common::Error);
  CHECK_THROWS_WITH_AS(
      build_gpt_datasets(options_for(blend_of({corpus.prefixes[0] + "_missing"}, "1")), {1, 0, 0}),
      doctest::Contains(("cannot read dataset file " + corpus.prefixes[0] +
                         "_missing.idx: No such file or directory (the dataset prefix " +
                         corpus.prefixes[0] + "_missing needs both")
                            .c_str()),
      common::Error);
  // A float dataset holds no token ids.
  const std::string floats = (corpus.directory.path / "floats").string();
  {
    IndexedDatasetWriter writer(floats, DType::float32);
    const std::vector<std::byte> values(4 * 8);
    writer.add_documents(values, std::vector<int32_t>{8}, std::vector<int32_t>{1});
    writer.finalize();
  }
  CHECK_THROWS_WITH_AS(build_gpt_datasets(options_for(blend_of({floats}, "1")), {1, 0, 0}),
                       doctest::Contains("dtype float32 does not hold token ids"), common::Error);
}

TEST_CASE("a blend naming one prefix several times builds it once, on a cold cache, with any thread count") {
  // Two builder threads used to race on one cache file (same name, same process: same
  // temporary name), failing with "cannot create ...tmp-<pid>" or reading a file half renamed.
  for (int threads : {1, 2, 4}) {
    CAPTURE(threads);
    Corpus corpus({200, 150});
    const std::string a = corpus.prefixes[0], b = corpus.prefixes[1];
    for (int round = 0; round < 3; ++round) {  // cold, then warm caches
      CAPTURE(round);
      const auto weighted = build_gpt_datasets(
          options_for(blend_of({"0.3", a, "0.3", a, "0.2", b, "0.2", a}, "90,10,0"), threads), {400, 30, 0});
      REQUIRE(weighted[0]);
      const auto& members = weighted[0]->blend()->datasets();
      REQUIRE(members.size() == 4);
      // Identical requests share one dataset; a different request of the same prefix does not.
      CHECK(members[0] == members[1]);
      CHECK(members[0] != members[3]);
      CHECK(members[0]->prefix() == members[3]->prefix());
      const auto unweighted = build_gpt_datasets(options_for(blend_of({a, b, a}, "90,10,0"), threads), {400, 30, 0});
      REQUIRE(unweighted[0]);
      CHECK(unweighted[0]->blend()->datasets()[0] == unweighted[0]->blend()->datasets()[2]);
      // The same samples as a single-threaded build.
      const auto reference = build_gpt_datasets(
          options_for(blend_of({"0.3", a, "0.3", a, "0.2", b, "0.2", a}, "90,10,0"), 1), {400, 30, 0});
      std::vector<int32_t> sample(17), expected(17);
      for (int64_t i = 0; i < reference[0]->size(); i += 7) {
        weighted[0]->sample(i, sample);
        reference[0]->sample(i, expected);
        REQUIRE(sample == expected);
      }
    }
    // Nothing but finished cache files is left.
    for (const auto& entry : std::filesystem::recursive_directory_iterator(corpus.directory.path)) {
      CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
    }
  }
}
