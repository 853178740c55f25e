// The batch-source adaptor of batch_source.hpp.
#include "backend/train/batch_source.hpp"

#include <algorithm>
#include <utility>

#include "backend/ops/cross_entropy.hpp"

namespace backend {

BatchSource mask_end_of_document_losses(BatchSource source, int32_t end_of_document) {
  return [source = std::move(source), end_of_document](
             Split split, int64_t first_sample, int64_t batch_size, std::span<int32_t> tokens,
             std::span<int32_t> labels) {
    source(split, first_sample, batch_size, tokens, labels);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == end_of_document) labels[i] = kIgnoredLabel;
    }
  };
}

int64_t scored_label_count(std::span<const int32_t> labels) {
  return static_cast<int64_t>(
      std::count_if(labels.begin(), labels.end(), [](int32_t label) { return label != kIgnoredLabel; }));
}

}  // namespace backend
