// The mock dataset: deterministic, labels are tokens shifted by one, splits are disjoint.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/data/mock_dataset.hpp"

using namespace backend;

TEST_CASE("mock samples are reproducible from their index and labels are shifted tokens") {
  MockDataset dataset(1234, 1000, 16);
  std::vector<int32_t> tokens(3 * 16), labels(3 * 16), tokens2(16), labels2(16);
  dataset.fill_batch(Split::train, 10, 3, tokens, labels);
  dataset.fill_batch(Split::train, 11, 1, tokens2, labels2);  // sample 11 on its own
  for (int t = 0; t < 16; ++t) {
    CHECK(tokens[16 + t] == tokens2[t]);
    CHECK(labels[16 + t] == labels2[t]);
  }
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t + 1 < 16; ++t) CHECK(labels[b * 16 + t] == tokens[b * 16 + t + 1]);
  }
  std::set<int32_t> distinct(tokens.begin(), tokens.end());
  CHECK(distinct.size() > 30);  // pseudo-random, not a constant
  for (int32_t token : tokens) CHECK((token >= 0 && token < 1000));
}

TEST_CASE("train, validation and test samples differ, and the seed changes them") {
  MockDataset dataset(1234, 50257, 8), other_seed(99, 50257, 8);
  std::vector<int32_t> train(8), validation(8), test(8), reseeded(8), labels(8);
  dataset.fill_batch(Split::train, 0, 1, train, labels);
  dataset.fill_batch(Split::validation, 0, 1, validation, labels);
  dataset.fill_batch(Split::test, 0, 1, test, labels);
  other_seed.fill_batch(Split::train, 0, 1, reseeded, labels);
  CHECK(train != validation);
  CHECK(validation != test);
  CHECK(train != reseeded);
}

TEST_CASE("wrong buffer sizes and bad shapes are refused") {
  CHECK_THROWS_AS(MockDataset(1, 0, 8), common::Error);
  CHECK_THROWS_AS(MockDataset(1, 10, 0), common::Error);
  MockDataset dataset(1, 10, 8);
  std::vector<int32_t> tokens(7), labels(8);
  CHECK_THROWS_WITH_AS(dataset.fill_batch(Split::train, 0, 1, tokens, labels),
                       doctest::Contains("expected 1 × 8"), common::Error);
}
