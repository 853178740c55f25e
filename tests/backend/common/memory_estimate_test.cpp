// The shared memory estimate: the parameter count of known models, the byte bookkeeping of
// mixed and fp32 training, ZeRO stages and offload, pipeline stages and schedules, what
// recompute and flash-style attention drop, and the refusal with its table.
#include "backend/common/memory_estimate.hpp"

#include <doctest/doctest.h>

#include <string>

#include "backend/common/error.hpp"

namespace {
// GPT-2 small as Megatron pads it: 12 × 768, 12 heads, 1024 positions, vocabulary 50304.
common::ModelShape gpt2_small() {
  return {.num_layers = 12, .hidden_size = 768, .num_attention_heads = 12,
          .ffn_hidden_size = 3072, .padded_vocab_size = 50304, .position_rows = 1024};
}
// Small enough to count by hand: 4 layers of h 8 (2 heads), f 32, RMSNorm, no biases, RoPE,
// vocabulary 64, tied. Per layer q, k, v 3·8·8 = 192, output 64, fc1 256, fc2 256, two norms
// 16: 784; embedding 512; final norm 8; 3,656 in all.
common::ModelShape toy() {
  return {.num_layers = 4, .hidden_size = 8, .num_attention_heads = 2, .ffn_hidden_size = 32,
          .padded_vocab_size = 64, .linear_biases = false, .norm_biases = false};
}
// One token of fp32 training on one rank, dp 4.
common::TrainingSetup toy_setup(int64_t zero_stage) {
  common::TrainingSetup setup;
  setup.data_parallel = 4;
  setup.zero_stage = zero_stage;
  return setup;
}
}  // namespace

TEST_CASE("parameter counts of known models") {
  // 124,439,808 with GPT-2's 50257 rows, plus 47 padded rows of 768.
  CHECK(common::parameter_count(gpt2_small()) == 124'475'904.0);
  // Llama 2 7B: 32 × 4096, SwiGLU 11008, RMSNorm, no biases, untied, RoPE, vocabulary 32000.
  const common::ModelShape llama{.num_layers = 32, .hidden_size = 4096, .num_attention_heads = 32,
                                 .ffn_hidden_size = 11008, .padded_vocab_size = 32000,
                                 .gated_mlp = true, .linear_biases = false, .norm_biases = false,
                                 .untied_output = true};
  CHECK(common::parameter_count(llama) == 6'738'415'616.0);
  // Sizes far beyond int64 products are numbers, not overflows.
  auto huge = gpt2_small();
  huge.hidden_size = int64_t{1} << 62;
  CHECK(common::parameter_count(huge) > 1e37);
}

TEST_CASE("bytes per parameter, and what recompute and stored scores change") {
  common::TrainingSetup fp32;
  fp32.seq_length = 1024;
  fp32.micro_batch_size = 4;
  const auto plain = common::estimate_training_memory(gpt2_small(), fp32);
  CHECK(plain.weights_bytes == doctest::Approx(4 * plain.parameters));
  CHECK(plain.gradients_bytes == doctest::Approx(4 * plain.parameters));
  CHECK(plain.optimizer_bytes == doctest::Approx(8 * plain.parameters));
  auto mixed_setup = fp32;
  mixed_setup.mixed_precision = true;
  const auto mixed = common::estimate_training_memory(gpt2_small(), mixed_setup);
  CHECK(mixed.weights_bytes == doctest::Approx(2 * mixed.parameters));
  CHECK(mixed.optimizer_bytes == doctest::Approx(12 * mixed.parameters));
  // Korthikanti's 5·a·s²·b attention term is the only difference without stored scores.
  auto flash = fp32;
  flash.attention_scores_stored = false;
  const auto blockwise = common::estimate_training_memory(gpt2_small(), flash);
  CHECK(plain.activations_bytes - blockwise.activations_bytes ==
        doctest::Approx(12.0 * 5 * 12 * 1024.0 * 1024 * 4 * 2));
  auto full = fp32;
  full.recompute = common::Recompute::full;
  CHECK(common::estimate_training_memory(gpt2_small(), full).activations_bytes <
        plain.activations_bytes / 3);
  const auto conversion = common::estimate_conversion_memory(gpt2_small());
  CHECK(conversion.total_bytes() == doctest::Approx(8 * conversion.parameters));
  // Resharding: the whole weights and moments, and one target rank's share of them.
  const auto reshard = common::estimate_reshard_memory(gpt2_small(), true, 4);
  CHECK(reshard.parameters == conversion.parameters);
  CHECK(reshard.total_bytes() == doctest::Approx(12 * 1.25 * reshard.parameters));
  CHECK(common::estimate_reshard_memory(gpt2_small(), false, 1).total_bytes() ==
        doctest::Approx(8 * reshard.parameters));
}

TEST_CASE("tensor, sequence and data parallelism divide what each rank holds") {
  common::TrainingSetup one;
  one.seq_length = 1024;
  one.micro_batch_size = 4;
  one.attention_scores_stored = false;
  const auto whole = common::estimate_training_memory(gpt2_small(), one);
  auto tp4 = one;
  tp4.tensor_parallel = 4;
  const auto tensor_parallel = common::estimate_training_memory(gpt2_small(), tp4);
  CHECK(tensor_parallel.weights_bytes == doctest::Approx(whole.weights_bytes / 4));
  const double sbh = 1024.0 * 4 * 768 * 2;  // one 16-bit-counted s·b·h, in fp32 bytes
  // Per layer 10 + 24/4 = 16 sbh without sequence parallelism, 4 + 30/4 = 11.5 with it.
  auto sp = tp4;
  sp.sequence_parallel = true;
  const auto sequence_parallel = common::estimate_training_memory(gpt2_small(), sp);
  CHECK(tensor_parallel.activations_bytes - sequence_parallel.activations_bytes ==
        doctest::Approx(12 * (16.0 - 11.5) * sbh));
  auto zero = one;
  zero.data_parallel = 8;
  zero.zero_stage = 1;
  CHECK(common::estimate_training_memory(gpt2_small(), zero).optimizer_bytes ==
        doctest::Approx(whole.optimizer_bytes / 8));
  // Sequence parallelism without tensor parallelism changes nothing.
  auto sp1 = one;
  sp1.sequence_parallel = true;
  CHECK(common::estimate_training_memory(gpt2_small(), sp1).activations_bytes ==
        doctest::Approx(whole.activations_bytes));
}

TEST_CASE("memory estimate: what each ZeRO stage keeps of 3,656 fp32 parameters at dp 4") {
  REQUIRE(common::parameter_count(toy()) == 3656.0);
  const auto none = common::estimate_training_memory(toy(), toy_setup(0));
  CHECK(none.weights_bytes == 4.0 * 3656);
  CHECK(none.gradients_bytes == 4.0 * 3656);
  CHECK(none.optimizer_bytes == 8.0 * 3656);
  // Stages 1 and 2, pretrain_gpt's distributed optimizer: the moments ÷ 4, and the whole
  // gradient buffer plus the reduce-scattered shard the optimizer reads.
  for (int64_t stage : {1, 2}) {
    CAPTURE(stage);
    const auto sharded = common::estimate_training_memory(toy(), toy_setup(stage));
    CHECK(sharded.weights_bytes == 4.0 * 3656);
    CHECK(sharded.gradients_bytes == 4.0 * 3656 + 4.0 * 3656 / 4);  // 18,280
    CHECK(sharded.optimizer_bytes == 8.0 * 3656 / 4);               // 7,312
    CHECK(sharded.host_bytes == 0);
  }
  // Stage 3: everything ÷ 4, plus the working slots of pretrain_gpt's ZeRO-3, the embedding
  // (512), a layer (784) and the head (the final norm, 8: the tied output is the embedding),
  // each for the gathered parameters and their whole gradients.
  const auto stage3 = common::estimate_training_memory(toy(), toy_setup(3));
  CHECK(stage3.weights_bytes == 4.0 * 3656 / 4 + 4.0 * (512 + 784 + 8));    // 8,872
  CHECK(stage3.gradients_bytes == 4.0 * 3656 / 4 + 4.0 * (512 + 784 + 8));  // 8,872
  CHECK(stage3.optimizer_bytes == 8.0 * 3656 / 4);                          // 7,312
  CHECK(stage3.host_bytes == 0);
  CHECK(stage3.activations_bytes == none.activations_bytes);
  // One layer per stage (pp 4), no activations: the last stage (its layer, the tied copy of the
  // embedding and the final norm, 784 + 520) outweighs the first (784 + 512); it has a layer's
  // slot and the head's.
  auto pipelined = toy_setup(3);
  pipelined.pipeline_parallel = 4;
  pipelined.seq_length = 0;
  const auto per_stage = common::estimate_training_memory(toy(), pipelined);
  CHECK(per_stage.weights_bytes == 4.0 * (784 + 520) / 4 + 4.0 * (784 + 520));  // 6,520
  CHECK(per_stage.activations_bytes == 0);
}

TEST_CASE("memory estimate: offload moves the optimizer and parameter shards to the host") {
  // Stage 3 at dp 4 as above: the moments (7,312) and the fp32 gradient shard they are
  // updated from (3,656) go to the host; the device keeps its weights and the working set
  // (1,304 parameters, 5,216 B each for weights and gradients).
  auto optimizer_setup = toy_setup(3);
  optimizer_setup.offload_optimizer = true;
  const auto optimizer = common::estimate_training_memory(toy(), optimizer_setup);
  CHECK(optimizer.weights_bytes == 8872.0);
  CHECK(optimizer.gradients_bytes == 5216.0);
  CHECK(optimizer.optimizer_bytes == 0);
  CHECK(optimizer.host_bytes == 7312.0 + 3656.0);
  // offload_param: the parameter shard (3,656) too; the working set stays.
  auto both_setup = optimizer_setup;
  both_setup.offload_parameters = true;
  const auto both = common::estimate_training_memory(toy(), both_setup);
  CHECK(both.weights_bytes == 5216.0);
  CHECK(both.host_bytes == 7312.0 + 3656.0 + 3656.0);
  CHECK(both.total_bytes() == doctest::Approx(5216.0 + 5216.0 + both.activations_bytes));
  auto parameters_setup = toy_setup(3);
  parameters_setup.offload_parameters = true;
  const auto parameters = common::estimate_training_memory(toy(), parameters_setup);
  CHECK(parameters.weights_bytes == 5216.0);
  CHECK(parameters.optimizer_bytes == 7312.0);
  CHECK(parameters.host_bytes == 3656.0);
  // Mixed precision at stage 1: bf16 weights and the whole fp32 gradient buffer stay; the
  // fp32 master weights and moments (12 B ÷ 4) and the gradient shard (4 B ÷ 4) move.
  auto mixed_setup = toy_setup(1);
  mixed_setup.mixed_precision = true;
  mixed_setup.offload_optimizer = true;
  const auto mixed = common::estimate_training_memory(toy(), mixed_setup);
  CHECK(mixed.weights_bytes == 2.0 * 3656);
  CHECK(mixed.gradients_bytes == 4.0 * 3656);
  CHECK(mixed.optimizer_bytes == 0);
  CHECK(mixed.host_bytes == 12.0 * 3656 / 4 + 4.0 * 3656 / 4);  // 14,624
  // The table names the host memory after the device total, only when there is some.
  const auto lines = common::format_memory_estimate(mixed, " of 80.00 GB");
  REQUIRE(lines.size() == 6);
  CHECK(lines[4].starts_with("  total "));
  CHECK(lines[4].ends_with(" of 80.00 GB"));
  CHECK(lines[5] == "  host memory          0.00 GB (offloaded, not in the total)");
  CHECK(common::format_memory_estimate(common::estimate_training_memory(toy(), toy_setup(3)))
            .size() == 5);
  // DeepSpeed's own rules: offload needs a ZeRO stage, offload_param stage 3.
  auto unsharded = toy_setup(0);
  unsharded.offload_optimizer = true;
  CHECK_THROWS_WITH_AS(common::estimate_training_memory(toy(), unsharded),
                       doctest::Contains("offloading the optimizer needs ZeRO stage 1, 2 or 3"),
                       common::Error);
  auto stage2 = toy_setup(2);
  stage2.offload_parameters = true;
  CHECK_THROWS_WITH_AS(common::estimate_training_memory(toy(), stage2),
                       doctest::Contains("offloading the parameters needs ZeRO stage 3"),
                       common::Error);
  CHECK_THROWS_WITH_AS(common::estimate_training_memory(toy(), toy_setup(4)),
                       "ZeRO stage 4 is not a stage: 0 (none), 1, 2 or 3", common::Error);
}

TEST_CASE("memory estimate: the first stage holds the embedding, the last the output layer") {
  // GPT-2 small, fp32, s 1024, b 4, pp 2, full recompute: the last stage (6 layers, the output
  // layer or the tied copy of the embedding, the final norm; one micro batch in flight and the
  // fp32 logits, whose gradient the fused classifier writes over them) holds more than the
  // first (6 layers, embedding and position table; two micro batches in flight).
  const double per_layer = 7'087'872;
  const double sbh = 1024.0 * 4 * 768 * 2;  // one 16-bit-counted s·b·h, in fp32 bytes
  const double logits = 1024.0 * 4 * 50304 * 4;
  for (bool untied : {false, true}) {
    CAPTURE(untied);
    auto shape = gpt2_small();
    shape.untied_output = untied;
    common::TrainingSetup setup;
    setup.seq_length = 1024;
    setup.micro_batch_size = 4;
    setup.pipeline_parallel = 2;
    setup.attention_scores_stored = false;
    setup.recompute = common::Recompute::full;
    const auto last = common::estimate_training_memory(shape, setup);
    CHECK(last.weights_bytes == doctest::Approx(4 * (6 * per_layer + 50304.0 * 768 + 1536)));
    // Each layer's input (2 of the 34), plus one layer's worth, and the logits.
    CHECK(last.activations_bytes == doctest::Approx((6 * 2 + 34) * sbh + logits));
  }
}

TEST_CASE("memory estimate: interleaving keeps 1 + (pp − 1)/(pp·V) times 1F1B's layers") {
  // GPT-2 small, fp32, s 1024, b 4, pp 6: the first stage holds the most (no logits there).
  common::TrainingSetup setup;
  setup.seq_length = 1024;
  setup.micro_batch_size = 4;
  setup.pipeline_parallel = 6;
  setup.attention_scores_stored = false;
  const double layer = 34 * 1024.0 * 4 * 768 * 2;
  // 1F1B: 6 micro batches of 2 layers.
  CHECK(common::estimate_training_memory(gpt2_small(), setup).activations_bytes ==
        doctest::Approx(12 * layer));
  // V = 2: 2·5 + 6 + 1 = 17 chunks of one layer, 12 · (1 + 5/12).
  setup.virtual_pipeline_chunks = 2;
  CHECK(common::estimate_training_memory(gpt2_small(), setup).activations_bytes ==
        doctest::Approx(17 * layer));
  // Full recompute keeps only each layer's input (2·s·b·h of the 34), plus one layer's worth:
  // then the last stage, 2·0 + 6 + 1 = 7 chunks and the fp32 logits, holds the most.
  setup.recompute = common::Recompute::full;
  const double logits = 1024.0 * 4 * 50304 * 4;
  CHECK(common::estimate_training_memory(gpt2_small(), setup).activations_bytes ==
        doctest::Approx(7 * 2.0 / 34 * layer + layer + logits));
}

TEST_CASE("a model over the capacity is refused with the estimate table") {
  common::TrainingSetup setup;
  const auto estimate = common::estimate_training_memory(gpt2_small(), setup);
  CHECK_NOTHROW(common::require_memory_fits(estimate, {estimate.total_bytes(), "test"}, "m", ""));
  try {
    common::require_memory_fits(estimate, {1e9, "physical memory"}, "pretrain_gpt: the model",
                                "Train a smaller model.");
    FAIL("expected a refusal");
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CHECK(message.starts_with("pretrain_gpt: the model does not fit in this machine's memory: an "
                              "estimated "));
    CHECK(message.find("for 1.00 GB available (physical memory)") != std::string::npos);
    CHECK(message.find("\n  optimizer states ") != std::string::npos);
    CHECK(message.ends_with("\nTrain a smaller model."));
  }
  CHECK(common::available_memory().bytes > 0);
}
