// Megatron's blending indices: the kinetic tournament gives exactly the arrays of Megatron's
// scan over all datasets at every step (a plain transcription in this test, and, with numpy
// installed, a pure-Python one, which cannot fuse multiply-adds), including equal, nearly equal,
// zero and tiny weights; and BlendedDataset reads the samples the arrays name and caches them.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/blended_dataset.hpp"
#include "tests/backend/data/dataset_fixture.hpp"
#include "tests/backend/data/numpy_reference.hpp"
#include "tests/temporary_directory.hpp"

using namespace backend;

namespace {

// helpers.cpp's build_blending_indices, step by step over every dataset.
void reference_blending(const std::vector<double>& weights, std::vector<int16_t>& dataset_index,
                        std::vector<int64_t>& sample_index) {
  std::vector<int64_t> taken(weights.size(), 0);
  for (size_t step = 0; step < dataset_index.size(); ++step) {
    const double x = std::max(static_cast<double>(step), 1.0);
    size_t best = 0;
    double best_error = 0;
    for (size_t d = 0; d < weights.size(); ++d) {
      volatile double product = weights[d] * x;  // no fused multiply-add, as Megatron's build
      const double error = product - static_cast<double>(taken[d]);
      if (d == 0 || error > best_error) {
        best = d;
        best_error = error;
      }
    }
    dataset_index[step] = static_cast<int16_t>(best);
    sample_index[step] = taken[best]++;
  }
}

void check_against_reference(const std::vector<double>& weights, size_t size) {
  std::vector<int16_t> expected_index(size), index(size);
  std::vector<int64_t> expected_samples(size), samples(size);
  reference_blending(weights, expected_index, expected_samples);
  build_blending_indices(weights, index, samples);
  size_t first_difference = size;
  for (size_t i = 0; i < size && first_difference == size; ++i) {
    if (index[i] != expected_index[i] || samples[i] != expected_samples[i]) first_difference = i;
  }
  CAPTURE(weights.size());
  CAPTURE(first_difference);
  CHECK(first_difference == size);
}

std::vector<double> normalized(std::vector<double> weights) {
  return normalize_weights(normalize_weights(weights, "w"), "w");
}

}  // namespace

TEST_CASE("blending indices equal Megatron's scan: simple blends") {
  check_against_reference(normalized({0.3, 0.7}), 1000);
  check_against_reference(normalized({1}), 10);
  check_against_reference(normalized({1, 1, 1, 1, 1, 1, 1}), 5000);    // equal weights: ties
  check_against_reference(normalized({0, 1, 0, 2}), 3000);             // zero weights
  check_against_reference(normalized({1e-9, 1, 1e-7, 0.5}), 20000);   // tiny weights
  check_against_reference(normalized({3, 5}), 0);
  // The first two steps both use x = 1.
  std::vector<int16_t> index(2);
  std::vector<int64_t> samples(2);
  build_blending_indices(std::vector<double>{0.5, 0.5}, index, samples);
  CHECK(index == std::vector<int16_t>{0, 1});
}

TEST_CASE("blending indices equal Megatron's scan: many datasets, near ties") {
  std::mt19937_64 generator(2024);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  for (int datasets : {3, 17, 100, 2048, 2419}) {
    std::vector<double> weights(static_cast<size_t>(datasets));
    for (double& weight : weights) weight = uniform(generator);
    check_against_reference(normalized(weights), datasets > 1000 ? 30000 : 50000);
  }
  // Weights one ulp apart, and pairs of equal weights among others (on both sides of the
  // 384 datasets up to which the scan itself runs).
  for (int datasets : {64, 1024}) {
    std::vector<double> close;
    for (int i = 0; i < datasets; ++i) close.push_back(std::nextafter(1.0 / datasets, i % 2 ? 1.0 : 0.0));
    check_against_reference(close, 30000);
    std::vector<double> pairs;
    for (int i = 0; i < datasets; ++i) pairs.push_back(1.0 + (i / 2) * 0.37);
    check_against_reference(normalized(pairs), 40000);
  }
  // Sizes (token counts) as weights, the blend of prefixes without weights.
  std::vector<double> sizes;
  for (int i = 0; i < 1000; ++i) sizes.push_back(static_cast<double>(1000 + (i * 7919) % 5000));
  check_against_reference(normalized(sizes), 60000);
}

TEST_CASE("blending indices equal a pure-Python transcription of Megatron's") {
  if (!test_support::numpy_available()) return;
  test_support::TemporaryDirectory directory;
  std::mt19937_64 generator(5);
  std::uniform_real_distribution<double> uniform(0, 10);
  for (int datasets : {2, 9, 60}) {
    std::vector<double> raw(static_cast<size_t>(datasets));
    std::string list;
    for (double& weight : raw) {
      weight = uniform(generator);
      if (!list.empty()) list += ',';
      list += fmt::format("{}", weight);
    }
    const auto weights = normalized(raw);
    const size_t size = 20000;
    std::vector<int16_t> index(size);
    std::vector<int64_t> samples(size);
    build_blending_indices(weights, index, samples);
    const std::string base = (directory.path / fmt::format("blend{}", datasets)).string();
    const std::vector<int64_t> shape = {static_cast<int64_t>(size)};
    write_npy<int16_t>(base + "-dataset_index.npy", index, shape);
    write_npy<int64_t>(base + "-dataset_sample_index.npy", samples, shape);
    const auto result = test_support::run_command(
        test_support::dataset_reference(fmt::format("blend {} {} {}", list, size, base)));
    CAPTURE(result.output);
    CHECK(result.exit_status == 0);
  }
}

TEST_CASE("a blended dataset reads the samples its indices name, and caches them") {
  test_support::TemporaryDirectory directory;
  GptDatasetConfig config;
  config.sequence_length = 4;
  config.split = "1";
  config.split_matrix = split_matrix_from_vector(parse_split("1"));
  std::vector<std::shared_ptr<const GptDataset>> members;
  for (int d = 0; d < 3; ++d) {
    const std::string prefix = (directory.path / fmt::format("part{}", d)).string();
    test_support::write_fixture_dataset(prefix, test_support::random_lengths(30, 1, 12, 40 + d));
    members.push_back(std::make_shared<const GptDataset>(std::make_shared<const IndexedDataset>(prefix),
                                                         prefix, 0, 30, 60, Split::train, config));
  }
  const std::string cache = (directory.path / "blend_cache").string();
  BlendedDataset blend(members, {2, 1, 1}, 100, cache);
  CHECK(blend.size() == 100);
  CHECK(blend.weights() == std::vector<double>{0.5, 0.25, 0.25});
  std::vector<int32_t> ours(5), direct(5);
  std::vector<int64_t> per_dataset(3, 0);
  for (int64_t i = 0; i < blend.size(); ++i) {
    const auto [dataset, sample] = blend.source(i);
    CHECK(sample == per_dataset[static_cast<size_t>(dataset)]++);
    blend.sample(i, ours);
    members[static_cast<size_t>(dataset)]->sample(sample, direct);
    CHECK(ours == direct);
  }
  CHECK(per_dataset == std::vector<int64_t>{50, 25, 25});
  REQUIRE(std::filesystem::exists(cache + "/" + blend.description_hash() + "-BlendedDataset-train-dataset_index.npy"));

  BlendedDataset again(members, {2, 1, 1}, 100, cache);
  CHECK(again.description_hash() == blend.description_hash());
  for (int64_t i = 0; i < 100; ++i) CHECK(again.source(i) == blend.source(i));

  // Taking more samples from a dataset than it has is refused, naming it.
  CHECK_THROWS_WITH_AS(BlendedDataset(members, {1, 0, 0}, members[0]->size() + 1, ""),
                       doctest::Contains("part0, which has"), common::Error);
}
