// The micro batches' activations (micro_batch_activations.hpp): a reserve carves the plan's
// buffers once per shape, refuses what cannot be carved by name, and the checks and copies a
// micro batch's ids and results pass through.
#include "backend/model/micro_batch_activations.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/ops/cross_entropy.hpp"
#include "tests/backend/model/small_gpt_config.hpp"

using backend::ElementType;
using backend::GptConfig;
using backend::MicroBatchActivations;
using backend::RecomputeSchedule;
using backend::testing::small_gpt_config;

TEST_CASE("micro-batch activations are carved once per shape, one arena per slot") {
  const GptConfig config = small_gpt_config();
  const RecomputeSchedule schedule(config);
  const backend::PipelineStage whole_model;
  backend::CpuDevice device;
  MicroBatchActivations activations(config, schedule, whole_model, 1, ElementType::f32, 1, false,
                                    device);
  CHECK_FALSE(activations.reserved());
  CHECK(activations.kept_bytes() == 0);
  CHECK(activations.reserve(2, 4, 1));
  CHECK_FALSE(activations.reserve(2, 4, 1));  // the same shape: nothing carved again
  CHECK(activations.reserve(2, 4, 3));
  CHECK(activations.slots() == 3);
  CHECK(activations.rows() == 8);
  const backend::ActivationPlan plan =
      backend::plan_activations(config, schedule, 2, 4, ElementType::f32);
  CHECK(activations.kept_bytes() == plan.kept_bytes);
  CHECK(activations.slot(0).logits.numel == 8 * config.padded_vocab_size);
  CHECK(activations.slot(2).layers.size() == 2);
  CHECK(activations.slot(0).logits.data != activations.slot(1).logits.data);
  CHECK(activations.slot(1).forward_done == std::vector<bool>{false});
  CHECK(activations.shared().dresidual.numel == 8 * config.hidden_size);
  CHECK_THROWS_WITH_AS(activations.reserve(2, 4, 0),
                       "GptModel::reserve: 0 micro-batch slots; at least 1",
                       common::Error);
}

TEST_CASE("sequence parallelism needs a sequence its ranks share equally") {
  const GptConfig config = small_gpt_config();
  const RecomputeSchedule schedule(config);
  const backend::PipelineStage whole_model;
  backend::CpuDevice device;
  MicroBatchActivations activations(config, schedule, whole_model, 1, ElementType::f32, 2, true,
                                    device);
  CHECK_THROWS_WITH_AS(activations.reserve(1, 5, 1),
                       doctest::Contains("--seq-length 5 must be divisible by "
                                         "--tensor-model-parallel-size 2 with --sequence-parallel"),
                       common::Error);
  CHECK_FALSE(activations.reserved());
}

TEST_CASE("a micro batch's ids are checked against its shape and the vocabulary") {
  const GptConfig config = small_gpt_config();
  const std::vector<int32_t> tokens{1, 2, 3, 9};
  CHECK_NOTHROW(backend::check_token_ids(config, tokens, 2, 2));
  CHECK_THROWS_WITH_AS(backend::check_token_ids(config, tokens, 1, 2),
                       "tokens has 4 entries, expected batch size 1 × sequence length 2 = 2",
                       common::Error);
  const std::vector<int32_t> outside{1, 10, 3, 4};
  CHECK_THROWS_WITH_AS(backend::check_token_ids(config, outside, 2, 2),
                       "tokens value 10 at index 1 (batch row 0, position 1) is outside the "
                       "vocabulary [0, 10)",
                       common::Error);
  const std::vector<int32_t> labels{backend::kIgnoredLabel, 2, backend::kIgnoredLabel, 0};
  CHECK(backend::check_labels(config, labels, 2, 2) == 2);
  CHECK_THROWS_AS(backend::check_token_ids(config, labels, 2, 2), common::Error);
  CHECK_THROWS_WITH_AS(backend::check_micro_batch_shape(config, 1, 9),
                       "sequence length 9 is outside [1, 8] (--max-position-embeddings)",
                       common::Error);
}

TEST_CASE("a row's argmax is the first of its equal maxima, across blocks of rows") {
  backend::CpuDevice device;
  // Rows of 2^21 values: two rows per ~16 MiB block, so three rows take two blocks.
  const int64_t width = int64_t{1} << 21;
  std::vector<float> values(static_cast<size_t>(3 * width), 0.0f);
  values[5] = 2.0f;
  values[9] = 2.0f;
  values[static_cast<size_t>(width + width - 1)] = 1.0f;
  values[static_cast<size_t>(2 * width + 3)] = -1.0f;  // row 2: all 0 but one: index 0
  const backend::View view{values.data(), 3 * width, ElementType::f32, backend::MemoryKind::host};
  const std::vector<int32_t> expected{5, static_cast<int32_t>(width - 1), 0};
  CHECK(backend::row_argmax<float>(device, view, 3, width) == expected);
}
