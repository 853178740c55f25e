// The model's per-layer choices, each in its own file since the layer order (gpt_model.cpp)
// was left alone: the dropout masks by site (dropout_sites.hpp), the norm and RoPE's place in a
// fused qkv (layer_ops.hpp), and the layouts a model refuses before any memory is carved
// (model_parallelism.hpp). The numerics they feed are gpt_model_test.cpp's.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/model/dropout_sites.hpp"
#include "backend/model/layer_ops.hpp"
#include "backend/model/model_parallelism.hpp"
#include "small_gpt_config.hpp"

using backend::DropoutSite;
using backend::ForwardDropout;
using backend::TensorParallelRegion;

TEST_CASE("a dropout mask is keyed by seed, step, site and layer, and is off when it should be") {
  backend::GptConfig config = backend::testing::small_gpt_config();
  config.hidden_dropout = 0.1;
  config.attention_dropout = 0.2;
  const TensorParallelRegion alone(nullptr, false);
  const ForwardDropout training{true, 7, 3};

  const backend::Dropout hidden = dropout_at(DropoutSite::mlp_output, 1, config, training, alone);
  CHECK(hidden.probability == doctest::Approx(0.1));
  CHECK(hidden.key == backend::dropout_key(7, 3, 3, 1));
  CHECK(hidden.first_index == 0);
  const backend::Dropout attention = dropout_at(DropoutSite::attention, 1, config, training, alone);
  CHECK(attention.probability == doctest::Approx(0.2));
  CHECK(attention.key == backend::dropout_key(7, 3, 1, 1));
  // Every site and layer draws its own mask.
  CHECK(dropout_at(DropoutSite::attention_output, 1, config, training, alone).key != hidden.key);
  CHECK(dropout_at(DropoutSite::mlp_output, 0, config, training, alone).key != hidden.key);

  // Evaluation mode, or p = 0 at a site, draws nothing.
  CHECK_FALSE(dropout_at(DropoutSite::embedding, 0, config, {false, 7, 3}, alone).active());
  config.hidden_dropout = 0;
  CHECK_FALSE(dropout_at(DropoutSite::embedding, 0, config, training, alone).active());
  CHECK(dropout_at(DropoutSite::attention, 0, config, training, alone).active());
}

TEST_CASE("RoPE rotates the query heads and the key of every query group") {
  backend::GptConfig config = backend::testing::small_gpt_config();
  config.num_attention_heads = 8;
  config.hidden_size = 32;  // head_dim 4
  config.num_query_groups = 2;
  const backend::RotatedHeads grouped = backend::rotated_heads(config);
  CHECK(grouped.heads == 5);            // 4 query heads and the key
  CHECK(grouped.group_width == 6 * 4);  // [4 q | k | v] of 4 features
  config.num_query_groups = 0;          // one group per head: [q | k | v]
  const backend::RotatedHeads per_head = backend::rotated_heads(config);
  CHECK(per_head.heads == 2);
  CHECK(per_head.group_width == 3 * 4);
}

TEST_CASE("the layouts a model refuses are refused by name before anything is carved") {
  backend::CpuDevice device;
  const backend::GptConfig config = backend::testing::small_gpt_config();
  backend::ModelParallelism pipelined;
  pipelined.pipeline = {.pipeline_parallel = 2, .rank = 1};
  CHECK(backend::holds_tied_embedding(config, pipelined.pipeline));
  CHECK_FALSE(backend::holds_tied_embedding(config, backend::PipelineStage{}));
  CHECK_THROWS_WITH_AS(
      check_model_parallelism(config, pipelined, {1, 1}, backend::ElementType::f32, device),
      "GptModel: a pipeline of 2 stages over a pipeline group of 1 ranks", common::Error);
  CHECK_THROWS_WITH_AS(
      check_model_parallelism(config, pipelined, {1, 2}, backend::ElementType::f32, device),
      doctest::Contains("holds a tied word embedding but no embedding group"), common::Error);

  backend::GptConfig mixed = config;
  mixed.mixed_precision = backend::MixedPrecision::bf16;
  CHECK_THROWS_WITH_AS(
      check_model_parallelism(mixed, {}, {1, 1}, backend::ElementType::f32, device),
      doctest::Contains("bf16 activations need a device with bf16 ops (--device cuda)"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      check_model_parallelism(mixed, {}, {1, 1}, backend::ElementType::f64, device),
      doctest::Contains("keeps fp32 master weights"), common::Error);
  CHECK_NOTHROW(check_model_parallelism(config, {}, {1, 1}, backend::ElementType::f32, device));
}
