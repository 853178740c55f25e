// The recompute schedule (which layers the backward recomputes, in which chunks) and the
// activation plan (what each layer keeps, the slots recomputed layers share, the element types
// and sizes): checked layer by layer against Megatron's --recompute-* semantics.
#include "backend/model/activation_plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "backend/common/error.hpp"

using backend::ActivationPlan;
using backend::ElementType;
using backend::GptConfig;
using backend::RecomputeGranularity;
using backend::RecomputeMethod;
using backend::RecomputeSchedule;

namespace {

GptConfig five_layers(RecomputeGranularity granularity, RecomputeMethod method, int64_t layers) {
  GptConfig config;
  config.num_layers = 5;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 64;
  config.vocab_size = 64;
  config.padded_vocab_size = 64;
  config.max_position_embeddings = 8;
  config.recompute_granularity = granularity;
  config.recompute_method = method;
  config.recompute_num_layers = layers;
  return config;
}

int64_t numel(const ActivationPlan& plan, int64_t region) {
  return plan.layout.regions()[static_cast<size_t>(region)].numel;
}

}  // namespace

TEST_CASE("uniform recompute runs chunks of recompute_num_layers layers, the last one short") {
  const RecomputeSchedule schedule(
      five_layers(RecomputeGranularity::full, RecomputeMethod::uniform, 2));
  std::vector<int64_t> begins;
  std::vector<bool> lasts;
  for (int64_t l = 0; l < 5; ++l) {
    CHECK(schedule.recomputed(l));
    begins.push_back(schedule.chunk_begin(l));
    lasts.push_back(schedule.last_of_chunk(l));
  }
  CHECK(begins == std::vector<int64_t>{0, 0, 2, 2, 4});
  CHECK(lasts == std::vector<bool>{false, true, false, true, true});
  CHECK_FALSE(schedule.selective());
}

TEST_CASE("block recompute recomputes the first recompute_num_layers layers one by one") {
  const RecomputeSchedule schedule(
      five_layers(RecomputeGranularity::full, RecomputeMethod::block, 3));
  for (int64_t l = 0; l < 5; ++l) {
    CAPTURE(l);
    CHECK(schedule.recomputed(l) == (l < 3));
    if (l < 3) {
      CHECK(schedule.chunk_begin(l) == l);
      CHECK(schedule.last_of_chunk(l));
    }
  }
}

TEST_CASE("the plan keeps outputs only where a recompute or the final norm starts from them") {
  const GptConfig config = five_layers(RecomputeGranularity::full, RecomputeMethod::uniform, 2);
  const int64_t B = 2, T = 8, rows = B * T, C = config.hidden_size;
  const ActivationPlan plan =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::f32);
  REQUIRE(plan.layers.size() == 5);
  // Recomputed layers keep no internals in their own entry; chunk ends keep their output.
  for (size_t l = 0; l < 5; ++l) {
    CAPTURE(l);
    CHECK(numel(plan, plan.layers[l].qkv) == 0);
    CHECK(numel(plan, plan.layers[l].output) == (l % 2 == 1 || l == 4 ? rows * C : 0));
  }
  // Two slots; the first layer of a chunk needs an output there, the second does not.
  REQUIRE(plan.recompute_slots.size() == 2);
  CHECK(numel(plan, plan.recompute_slots[0].qkv) == rows * config.qkv_features());
  CHECK(numel(plan, plan.recompute_slots[0].output) == rows * C);
  CHECK(numel(plan, plan.recompute_slots[1].output) == 0);
  CHECK(numel(plan, plan.tokens) == rows);
  CHECK(plan.layout.regions()[static_cast<size_t>(plan.tokens)].type == ElementType::i32);
  CHECK(plan.layout.regions()[static_cast<size_t>(plan.loss_total)].type == ElementType::f64);
  // The same plan in fp64 keeps twice the bytes.
  const ActivationPlan doubled =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::f64);
  CHECK(doubled.kept_bytes == 2 * plan.kept_bytes);
  CHECK(doubled.layout.bytes() > plan.layout.bytes());
}

TEST_CASE("an inference-only plan carves the forward's buffers alike and no backward scratch") {
  GptConfig config = five_layers(RecomputeGranularity::none, RecomputeMethod::uniform, 1);
  const int64_t B = 2, T = 8, rows = B * T;
  const ActivationPlan training =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::f32);
  config.inference_only = true;
  const ActivationPlan inference =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::f32);
  CHECK(numel(training, training.dlogits) == rows * config.padded_vocab_size);
  CHECK(numel(training, training.dfc1) == rows * config.fc1_features());
  for (const int64_t region : {inference.dlogits, inference.dresidual, inference.dbranch,
                               inference.dnorm, inference.dqkv, inference.dhidden,
                               inference.dfc1}) {
    CAPTURE(inference.layout.regions()[static_cast<size_t>(region)].what);
    CHECK(numel(inference, region) == 0);
  }
  // What the forward writes is the same.
  CHECK(numel(inference, inference.logits) == numel(training, training.logits));
  CHECK(numel(inference, inference.branch) == numel(training, training.branch));
  CHECK(numel(inference, inference.layers[2].fc1) == numel(training, training.layers[2].fc1));
  CHECK(inference.kept_bytes == training.kept_bytes);
  CHECK(training.layout.bytes() - inference.layout.bytes() >=
        4 * rows * (config.padded_vocab_size + config.fc1_features()));
}

TEST_CASE("bf16 activations keep their statistics in fp32, as the ops' twins take them") {
  GptConfig config = five_layers(RecomputeGranularity::none, RecomputeMethod::uniform, 1);
  const int64_t B = 2, T = 8;
  const ActivationPlan fp32 =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::f32);
  const ActivationPlan bf16 =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::bf16);
  auto type = [](const ActivationPlan& plan, int64_t region) {
    return plan.layout.regions()[static_cast<size_t>(region)].type;
  };
  for (const auto& layer : bf16.layers) {
    CHECK(type(bf16, layer.qkv) == ElementType::bf16);
    CHECK(type(bf16, layer.fc1) == ElementType::bf16);
    CHECK(type(bf16, layer.output) == ElementType::bf16);
    CHECK(type(bf16, layer.input_norm_mean) == ElementType::f32);
    CHECK(type(bf16, layer.input_norm_rstd) == ElementType::f32);
    CHECK(type(bf16, layer.mlp_norm_rstd) == ElementType::f32);
    CHECK(type(bf16, layer.attention_logsumexp) == ElementType::f32);
  }
  for (const int64_t region : {bf16.losses, bf16.logsumexp, bf16.final_norm_rstd}) {
    CHECK(type(bf16, region) == ElementType::f32);
  }
  for (const int64_t region : {bf16.logits, bf16.dlogits, bf16.embedded, bf16.dresidual}) {
    CHECK(type(bf16, region) == ElementType::bf16);
  }
  CHECK(type(bf16, bf16.loss_total) == ElementType::f64);
  // The kept bytes: half of fp32's for the activations, the same for the statistics.
  CHECK(bf16.kept_bytes < fp32.kept_bytes);
  CHECK(bf16.kept_bytes > fp32.kept_bytes / 2);
  // RoPE's tables are statistics too.
  config.position_embedding_type = backend::PositionEmbeddingType::rope;
  const ActivationPlan rope =
      backend::plan_activations(config, RecomputeSchedule(config), B, T, ElementType::bf16);
  CHECK(numel(rope, rope.rope_cos) > 0);
  CHECK(type(rope, rope.rope_cos) == ElementType::f32);
  CHECK(type(rope, rope.rope_sin) == ElementType::f32);
}

TEST_CASE("a micro batch too large to address is refused, naming what overflows") {
  const GptConfig config = five_layers(RecomputeGranularity::none, RecomputeMethod::uniform, 1);
  const int64_t huge = std::numeric_limits<int64_t>::max() / 4;
  CHECK_THROWS_AS(
      backend::plan_activations(config, RecomputeSchedule(config), huge, 8, ElementType::f32),
      common::Error);
}
