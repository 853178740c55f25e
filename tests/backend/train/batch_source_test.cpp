// mask_end_of_document_losses (--eod-mask-loss): the labels after an EOD input token become
// kIgnoredLabel, the tokens and every other label stay as the source gave them.
#include "backend/train/batch_source.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "backend/ops/cross_entropy.hpp"

using namespace backend;

TEST_CASE("the EOD mask ignores the label of each position whose input is the end of document") {
  constexpr int32_t kEod = 9;
  // Two samples of five: tokens 9 at positions 0, 3 and 7 (the first and the last of a sample
  // among them); the labels are the next token of a stream.
  const std::vector<int32_t> stream = {9, 1, 2, 9, 3, 4, 5, 9, 6, 7, 8};
  BatchSource source = [&](Split split, int64_t first_sample, int64_t batch_size,
                           std::span<int32_t> tokens, std::span<int32_t> labels) {
    CHECK(split == Split::validation);
    CHECK(first_sample == 0);
    for (int64_t i = 0; i < batch_size * 5; ++i) {
      tokens[static_cast<size_t>(i)] = stream[static_cast<size_t>(i)];
      labels[static_cast<size_t>(i)] = stream[static_cast<size_t>(i + 1)];
    }
  };
  const BatchSource masked = mask_end_of_document_losses(source, kEod);
  std::vector<int32_t> tokens(10), labels(10);
  masked(Split::validation, 0, 2, tokens, labels);
  CHECK(tokens == std::vector<int32_t>(stream.begin(), stream.end() - 1));
  const int32_t ignored = kIgnoredLabel;
  CHECK(labels == std::vector<int32_t>{ignored, 2, 9, ignored, 4, 5, 9, ignored, 7, 8});
}
