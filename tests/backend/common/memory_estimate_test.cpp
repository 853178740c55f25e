// The shared memory estimate: the parameter count of known models, the byte bookkeeping of
// mixed and fp32 training, what recompute and flash-style attention drop, and the refusal
// with its table.
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
  zero.distributed_optimizer = true;
  CHECK(common::estimate_training_memory(gpt2_small(), zero).optimizer_bytes ==
        doctest::Approx(whole.optimizer_bytes / 8));
  // Sequence parallelism without tensor parallelism changes nothing.
  auto sp1 = one;
  sp1.sequence_parallel = true;
  CHECK(common::estimate_training_memory(gpt2_small(), sp1).activations_bytes ==
        doctest::Approx(whole.activations_bytes));
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
