// Where the trainer's batches come from, as one callable: the mock dataset, the datasets the
// data flags name (dataset_provider.hpp) or a test's pattern. Megatron passes data iterators;
// a function of the sample index is what makes resuming need only the consumed-sample count.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "backend/data/mock_dataset.hpp"

namespace backend {

// Fills tokens and labels, each (batch_size, seq_length), with samples first_sample ..
// first_sample + batch_size − 1 of the split.
using BatchSource = std::function<void(Split split, int64_t first_sample, int64_t batch_size,
                                       std::span<int32_t> tokens, std::span<int32_t> labels)>;

// --eod-mask-loss (Megatron's get_ltor_masks_and_position_ids with eod_mask_loss): `source`'s
// batches with the label of every position whose input token is `end_of_document` replaced
// by kIgnoredLabel (ops/cross_entropy.hpp), so the loss and its gradient leave out the
// prediction made from an EOD token, that of the next document's first token. Megatron's
// loss mask is 0 exactly there; the model's mean is over the other positions.
BatchSource mask_end_of_document_losses(BatchSource source, int32_t end_of_document);

// The labels that are not kIgnoredLabel: the positions a micro batch's loss is taken over
// (--calculate-per-token-loss weighs micro batches by it).
int64_t scored_label_count(std::span<const int32_t> labels);

}  // namespace backend
