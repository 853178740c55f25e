// pretrain() on --device cuda against --device cpu, fp32: 50 steps of a GPT-2-style model
// (learned positions, LayerNorm, GELU, biases, dropout) and of a Llama-style one (RoPE, RMSNorm,
// SwiGLU, grouped-query attention, no biases) whose losses follow the CPU's within 1e-4
// relative (the bound; the two differ by summation order only); two GPU runs give the
// same bits; a GPU run stopped by --exit-interval and resumed equals an uninterrupted one bit
// for bit; a checkpoint written on the GPU continues on the CPU and the other way round. --bf16
// (bf16 weights and activations, fp32 master weights and gradients): 50 steps within 2e-2 of
// the CPU's fp32 losses, the same bits run after run, and resumed bit for bit; the same with
// --use-flash-attn's tensor-core attention at head dimensions 64 and 128 (and in fp16), and
// cuDNN's fused attention (--attention-backend fused). --fp16
// likewise (with a loss scale of 4096, under which nothing overflows), resumed bit for bit with
// its scaler's state; from Megatron's initial loss scale 2^32 the fp16 gradients overflow, and
// the dynamic scaler skips those iterations and halves the scale until they fit, as Megatron's
// does, in steps replayed from CUDA graphs too (the eager run's bits), and the distributed
// optimizer's replayed steps remake the bf16 working copy from its updated range.
// With GPU_TESTS_ON_CPU=1 the "GPU" runs are --device cpu (checks the test itself).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "captured_log.hpp"
#include "gpu/gpu_test_support.hpp"
#include "temporary_directory.hpp"

using backend::TrainingArguments;
using backend::TrainingResult;

namespace {

// The --device of the runs under test, or nullopt after reporting the skip.
std::optional<std::string> gpu_device_or_skip() {
  const char* on_cpu = std::getenv("GPU_TESTS_ON_CPU");
  if (on_cpu != nullptr && std::string(on_cpu) == "1") {
    MESSAGE("GPU_TESTS_ON_CPU=1: --device cpu stands in for the GPU");
    return "cpu";
  }
  if (const auto reason = gpu_test::no_gpu_reason()) {
    MESSAGE("skipped: no CUDA GPU: " << *reason);
    return std::nullopt;
  }
  return "cuda";
}

TrainingArguments gpt2_style() {
  TrainingArguments a;
  a.model.num_layers = 2;
  a.model.hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.seq_length = 32;
  a.model.max_position_embeddings = 32;
  a.run.micro_batch_size = 2;
  a.run.global_batch_size = 4;
  a.run.train_iters = 50;
  a.optimizer.lr = 1e-3;
  a.optimizer.min_lr = 1e-4;
  a.optimizer.lr_warmup_iters = 5;
  a.optimizer.clip_grad = 1.0;
  a.tokenizer.vocab_size = 299;  // NullTokenizer adds EOD: 300, padded to 384: padding is exercised
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.data.mock_data = true;
  a.model.hidden_dropout = 0.1;
  a.model.attention_dropout = 0.1;
  a.logging.log_interval = 10;
  a.evaluation.eval_iters = 0;
  return a;
}

TrainingArguments llama_style() {
  TrainingArguments a = gpt2_style();
  a.model.num_attention_heads = 8;
  a.model.group_query_attention = true;
  a.model.num_query_groups = 2;
  a.model.position_embedding_type = backend::PositionEmbeddingType::rope;
  a.model.normalization = backend::Normalization::rms_norm;
  a.model.swiglu = true;
  a.model.ffn_hidden_size = 96;
  a.model.add_bias_linear = false;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.hidden_dropout = a.model.attention_dropout = 0;
  return a;
}

// `a` in "fp32", "bf16" or "fp16"; fp16 with a dynamic loss scale starting at 4096, which the
// tiny models' gradients fit (Megatron's 2^32 start has a test of its own).
TrainingArguments with_precision(TrainingArguments a, const std::string& precision) {
  a.precision.bf16 = precision == "bf16";
  a.precision.fp16 = precision == "fp16";
  if (a.precision.fp16) a.precision.initial_loss_scale = 4096;
  return a;
}

TrainingResult train(TrainingArguments a, const std::string& device) {
  a.device = common::enum_from_name_or_fail<backend::DeviceChoice>(device, "--device");
  backend::validate_arguments(a);
  std::ostringstream log;
  return backend::pretrain(a, log, {});
}

void expect_losses_close(const TrainingResult& actual, const TrainingResult& expected,
                         double relative) {
  REQUIRE(actual.iterations.size() == expected.iterations.size());
  for (size_t i = 0; i < actual.iterations.size(); ++i) {
    const double a = actual.iterations[i].lm_loss, e = expected.iterations[i].lm_loss;
    INFO("iteration " << i + 1 << ": " << a << " against the CPU's " << e);
    CHECK(std::isfinite(a));
    CHECK(std::fabs(a - e) <= relative * std::fabs(e));
  }
}

// `a` trained again with --cuda-graph-impl local after two eager warm-up steps: the result and
// what the trainer logged (which steps were captured, replayed or eager, and why).
struct GraphsRun {
  TrainingResult result;
  std::string log;
};
GraphsRun train_with_graphs(TrainingArguments a, const std::string& device) {
  a.cuda_graph_impl = backend::CudaGraphImpl::local;
  a.cuda_graph_warmup_steps = 2;
  test_support::CapturedLog log;
  GraphsRun run;
  run.result = train(a, device);
  run.log = log.text.str();
  return run;
}

void expect_identical_losses(const std::vector<backend::IterationRecord>& actual,
                             const std::vector<backend::IterationRecord>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("iteration " << actual[i].iteration);
    CHECK(actual[i].iteration == expected[i].iteration);
    CHECK(actual[i].lm_loss == expected[i].lm_loss);
    CHECK(actual[i].grad_norm == expected[i].grad_norm);
  }
}

}  // namespace

TEST_CASE("50 fp32 steps on the CUDA device follow the CPU's losses within 1e-4 relative") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  for (const auto& style :
       {std::pair{"GPT-2 style", gpt2_style()}, std::pair{"Llama style", llama_style()}}) {
    const std::string name = style.first;  // (clang 14: no CAPTURE of a structured binding)
    const TrainingArguments& arguments = style.second;
    CAPTURE(name);
    const TrainingResult cpu = train(arguments, "cpu");
    const TrainingResult gpu = train(arguments, *device);
    expect_losses_close(gpu, cpu, 1e-4);
    // Deterministic: no float atomics, so a second run is the same bits.
    expect_identical_losses(train(arguments, *device).iterations, gpu.iterations);
  }
}

TEST_CASE("50 bf16 and fp16 steps on the CUDA device follow the CPU's fp32 losses within 2e-2 "
          "relative") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  for (const auto& style :
       {std::pair{"GPT-2 style", gpt2_style()}, std::pair{"Llama style", llama_style()}}) {
    const std::string name = style.first;
    CAPTURE(name);
    const TrainingResult cpu = train(style.second, "cpu");
    for (const std::string precision : {"bf16", "fp16"}) {
      CAPTURE(precision);
      // The CUDA-core attention kernel (the other backends have their own cases below).
      TrainingArguments mixed = with_precision(style.second, precision);
      mixed.model.attention_backend = backend::AttentionBackend::local;
      const TrainingResult gpu = train(mixed, *device);
      for (const backend::IterationRecord& record : gpu.iterations) {
        INFO("iteration " << record.iteration << ", loss scale " << record.loss_scale);
        CHECK_FALSE(record.skipped);
      }
      expect_losses_close(gpu, cpu, 2e-2);
      expect_identical_losses(train(mixed, *device).iterations, gpu.iterations);
      if (*device == "cuda") {
        // The 16-bit type really ran: its rounding moves the losses off the fp32 GPU run's.
        const TrainingResult fp32 = train(style.second, *device);
        bool differs = false;
        for (size_t i = 0; i < fp32.iterations.size(); ++i) {
          differs = differs || fp32.iterations[i].lm_loss != gpu.iterations[i].lm_loss;
        }
        CHECK(differs);
      }
    }
  }
}

namespace {

// 50 bf16 and 50 fp16 steps of each style with `choose_attention` applied, against the CPU's fp32
// losses within 2e-2 relative, and a second run the same bits.
void expect_16_bit_runs_follow_the_cpu(
    const std::string& device,
    std::initializer_list<std::pair<const char*, TrainingArguments>> styles,
    const std::function<void(TrainingArguments&)>& choose_attention) {
  for (const auto& style : styles) {
    const std::string name = style.first;
    CAPTURE(name);
    const TrainingResult cpu = train(style.second, "cpu");
    for (const std::string precision : {"bf16", "fp16"}) {
      CAPTURE(precision);
      TrainingArguments mixed = with_precision(style.second, precision);
      choose_attention(mixed);
      const TrainingResult gpu = train(mixed, device);
      expect_losses_close(gpu, cpu, 2e-2);
      expect_identical_losses(train(mixed, device).iterations, gpu.iterations);
    }
  }
}

}  // namespace

TEST_CASE("50 bf16 and fp16 steps with --use-flash-attn (tensor-core attention) follow the "
          "CPU's fp32 losses within 2e-2 relative") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  // Head dimensions the tensor-core kernel takes (64: GPT-2 style with attention dropout; 128:
  // Llama style, multi-query) and sequences longer than its 64-row tile.
  TrainingArguments gpt2 = gpt2_style();
  gpt2.model.hidden_size = 128;
  gpt2.model.num_attention_heads = 2;
  gpt2.model.seq_length = gpt2.model.max_position_embeddings = 80;
  TrainingArguments llama = llama_style();
  llama.model.hidden_size = 256;
  llama.model.num_attention_heads = 2;
  llama.model.num_query_groups = 1;
  llama.model.seq_length = llama.model.max_position_embeddings = 80;
  expect_16_bit_runs_follow_the_cpu(
      *device, {{"GPT-2 style, head dim 64", gpt2}, {"Llama style, head dim 128", llama}},
      [](TrainingArguments& a) { a.model.use_flash_attn = true; });
}

TEST_CASE(
    "50 bf16 and fp16 steps with --attention-backend fused (cuDNN) follow the CPU's fp32 "
    "losses within 2e-2 relative, the same bits run to run") {
  const auto device = gpu_device_or_skip();
  if (!device || *device != "cuda") return;  // cuDNN has no CPU stand-in
  // No attention dropout (cuDNN's mask is not the CPU's: the next case), sequences of 128 positions
  // (every cuDNN 9 runs their backward); GPT-2 style multi-head at head dimension 64, Llama
  // style grouped-query (blocked queries) at 128.
  TrainingArguments gpt2 = gpt2_style();
  gpt2.model.hidden_size = 128;
  gpt2.model.num_attention_heads = 2;
  gpt2.model.attention_dropout = 0;
  gpt2.model.seq_length = gpt2.model.max_position_embeddings = 128;
  TrainingArguments llama = llama_style();
  llama.model.hidden_size = 512;
  llama.model.num_attention_heads = 4;
  llama.model.num_query_groups = 2;
  llama.model.seq_length = llama.model.max_position_embeddings = 128;
  expect_16_bit_runs_follow_the_cpu(
      *device, {{"GPT-2 style, head dim 64", gpt2}, {"Llama style, grouped, head dim 128", llama}},
      [](TrainingArguments& a) { a.model.attention_backend = backend::AttentionBackend::fused; });
}

TEST_CASE(
    "50 bf16 steps with attention dropout on cuDNN (--attention-backend fused) learn, the same "
    "bits run to run") {
  // cuDNN draws its own attention dropout mask (tests/gpu/attention_test.cpp reads it back and
  // checks the gradients against it), so the losses are not the CPU's: they fall, repeat, and
  // are not the losses without attention dropout.
  const auto device = gpu_device_or_skip();
  if (!device || *device != "cuda" || !gpu_test::cudnn_takes_attention_dropout_or_skip()) return;
  TrainingArguments a = with_precision(gpt2_style(), "bf16");
  a.model.hidden_size = 128;
  a.model.num_attention_heads = 2;
  a.model.seq_length = a.model.max_position_embeddings = 128;
  a.model.attention_backend = backend::AttentionBackend::fused;
  REQUIRE(a.model.attention_dropout == 0.1);
  const TrainingResult run = train(a, *device);
  REQUIRE(run.iterations.size() == 50);
  double first = 0, last = 0;
  for (size_t i = 0; i < 10; ++i) {
    first += run.iterations[i].lm_loss;
    last += run.iterations[40 + i].lm_loss;
  }
  for (const backend::IterationRecord& record : run.iterations)
    CHECK(std::isfinite(record.lm_loss));
  CHECK(last < first);
  expect_identical_losses(train(a, *device).iterations, run.iterations);
  a.model.attention_dropout = 0;
  const TrainingResult without = train(a, *device);
  CHECK(without.iterations.back().lm_loss != run.iterations.back().lm_loss);
}

TEST_CASE("fp16 from Megatron's initial loss scale 2^32 skips the overflowing iterations and "
          "halves the scale until the gradients fit") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  TrainingArguments fp16 = gpt2_style();
  fp16.precision.fp16 = true;  // Megatron's defaults: --initial-loss-scale 2^32, --hysteresis 2
  fp16.run.train_iters = 40;
  const TrainingResult run = train(fp16, *device);
  int64_t skipped = 0;
  for (const backend::IterationRecord& record : run.iterations) {
    INFO("iteration " << record.iteration << ", loss scale " << record.loss_scale);
    CHECK(std::isfinite(record.lm_loss));
    CHECK_FALSE(record.nan);
    if (record.skipped) ++skipped;
  }
  MESSAGE(skipped << " of 40 iterations skipped; final loss scale "
                  << run.iterations.back().loss_scale);
  if (*device == "cuda") {
    // 2^32 times the loss gradient is far beyond fp16's 65504: the first iterations overflow.
    CHECK(run.iterations.front().skipped);
    CHECK(run.iterations.back().loss_scale < 0x1p32);
    CHECK_FALSE(run.iterations.back().skipped);
    CHECK(skipped < 40);
    CHECK(run.iterations.back().lm_loss < run.iterations.front().lm_loss);
  }
}

TEST_CASE("a GPU run resumed from its checkpoint equals an uninterrupted one, bit for bit") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    CAPTURE(precision);
    test_support::TemporaryDirectory directory;
    TrainingArguments base = with_precision(gpt2_style(), precision);
    base.run.train_iters = 12;

    TrainingArguments whole_run = base;
    whole_run.checkpointing.save = (directory.path / "whole").string();
    const TrainingResult whole = train(whole_run, *device);

    TrainingArguments first_half = base;
    first_half.checkpointing.save = (directory.path / "resumed").string();
    first_half.run.exit_interval = 6;
    const TrainingResult first = train(first_half, *device);
    TrainingArguments second_half = base;
    second_half.checkpointing.save = second_half.checkpointing.load = first_half.checkpointing.save;
    const TrainingResult second = train(second_half, *device);

    std::vector<backend::IterationRecord> joined = first.iterations;
    joined.insert(joined.end(), second.iterations.begin(), second.iterations.end());
    expect_identical_losses(joined, whole.iterations);
  }
}

TEST_CASE("a checkpoint written on the GPU continues on the CPU, and the other way round") {
  const auto device = gpu_device_or_skip();
  if (!device) return;
  test_support::TemporaryDirectory directory;
  TrainingArguments base = llama_style();
  base.run.train_iters = 10;
  for (const auto& devices : {std::pair{*device, std::string("cpu")},
                              std::pair{std::string("cpu"), *device}}) {
    const std::string from = devices.first, to = devices.second;
    CAPTURE(from);
    CAPTURE(to);
    const auto save = directory.path / (from + "_to_" + to);
    TrainingArguments reference = base;
    const TrainingResult uninterrupted = train(reference, to);
    TrainingArguments first_half = base;
    first_half.checkpointing.save = save.string();
    first_half.run.exit_interval = 5;
    train(first_half, from);
    TrainingArguments second_half = base;
    second_half.checkpointing.load = second_half.checkpointing.save = save.string();
    const TrainingResult continued = train(second_half, to);
    REQUIRE(continued.iterations.size() == 5);
    // The first half ran on the other device, so the bits differ by its rounding only.
    TrainingResult tail;
    tail.iterations.assign(uninterrupted.iterations.begin() + 5, uninterrupted.iterations.end());
    expect_losses_close(continued, tail, 1e-4);
  }
}

TEST_CASE(
    "bf16 steps replayed from CUDA graphs (--cuda-graph-impl local) are the eager run's bits") {
  // One graph for the forward and backward (cuBLASLt's GEMMs, the attention of
  // --attention-backend auto: cuDNN's where it runs, and the fused classifier), one for AdamW
  // with the bf16 working copy; the coefficients, inputs and dropout keys staged before each
  // replay. The GPT-2 style keeps its dropout of 0.1 at every site (attention reads the staged
  // keys: cuDNN's seed is staged from them where cuDNN runs it), Llama's has none.
  const auto device = gpu_device_or_skip();
  if (!device) return;
  for (TrainingArguments a : {gpt2_style(), llama_style()}) {
    a.run.train_iters = 12;
    a.logging.log_interval = 1;
    a.logging.log_params_norm = true;
    // The testing aid scales the master weights before step 8: the 16-bit working copy must be
    // remade from them, which the replayed graphs do not (the update writes it): the trainer
    // runs eagerly again, then captures anew.
    a.spike.inject_loss_spike_at_iteration = 8;
    a = with_precision(a, *device == "cuda" ? "bf16" : "fp32");
    const TrainingResult eager = train(a, *device);
    const GraphsRun run = train_with_graphs(a, *device);
    const TrainingResult& replayed = run.result;
    const std::string& text = run.log;
    INFO(text);  // a capture the device refused says why here
    CHECK(text.find("step: graphs captured at iteration 3") != std::string::npos);
    CHECK(text.find("step: eager at iteration 8 (warm-up step 1 of 2)") != std::string::npos);
    CHECK(text.find("step: graphs captured at iteration 10") != std::string::npos);
    CHECK(text.find("failed") == std::string::npos);
    expect_identical_losses(replayed.iterations, eager.iterations);
    for (size_t i = 0; i < eager.iterations.size(); ++i) {
      CHECK(replayed.iterations[i].params_norm == eager.iterations[i].params_norm);
    }
  }
}

TEST_CASE(
    "bf16 steps of the distributed optimizer replayed from CUDA graphs remake the working copy "
    "every step, an evaluation before the capture or not") {
  // The distributed optimizer's update writes the fp32 range, not the bf16 working copy: the
  // forward's graph makes it. An evaluation after iteration 2 (the last warm-up step) makes it
  // just before the capture at 3, which must hold the conversion anyway: a graph holds only
  // what its capture ran, and replays would train on iteration 2's copy.
  const auto device = gpu_device_or_skip();
  if (!device) return;
  TrainingArguments a = gpt2_style();
  a.run.train_iters = 8;
  a.logging.log_interval = 1;
  a.parallelism.use_distributed_optimizer = true;
  a.evaluation.eval_interval = 2;
  a.evaluation.eval_iters = 1;
  a = with_precision(a, *device == "cuda" ? "bf16" : "fp32");
  const TrainingResult eager = train(a, *device);
  const GraphsRun run = train_with_graphs(a, *device);
  const TrainingResult& replayed = run.result;
  const std::string& text = run.log;
  INFO(text);
  CHECK(text.find("step: graphs captured at iteration 3") != std::string::npos);
  CHECK(text.find("step: eager at iteration 4") == std::string::npos);
  expect_identical_losses(replayed.iterations, eager.iterations);
  CHECK(replayed.validation_loss == eager.validation_loss);
}

TEST_CASE(
    "fp16 steps replayed from CUDA graphs take each step's loss scale: the eager run's bits") {
  // From Megatron's initial scale 2^32 the first fp16 gradients overflow: skipped steps halve
  // the scale (hysteresis 1), two clean ones double it, inside the replays too. The scale and
  // its inverse are staged before each replay, not captured.
  const auto device = gpu_device_or_skip();
  if (!device) return;
  TrainingArguments a = gpt2_style();
  a.run.train_iters = 16;
  a.logging.log_interval = 1;
  a = with_precision(a, "fp16");
  a.precision.initial_loss_scale = 0x1p32;
  a.precision.hysteresis = 1;
  a.precision.loss_scale_window = 2;
  const TrainingResult eager = train(a, *device);
  const GraphsRun run = train_with_graphs(a, *device);
  const TrainingResult& replayed = run.result;
  const std::string& text = run.log;
  INFO(text);
  CHECK(text.find("step: graphs captured at iteration 3") != std::string::npos);
  CHECK(text.find("step: eager at iteration 4") == std::string::npos);
  REQUIRE(replayed.iterations.size() == eager.iterations.size());
  std::set<double> scales;
  for (size_t i = 0; i < eager.iterations.size(); ++i) {
    INFO("iteration " << eager.iterations[i].iteration);
    CHECK(replayed.iterations[i].lm_loss == eager.iterations[i].lm_loss);
    CHECK(std::bit_cast<uint64_t>(replayed.iterations[i].grad_norm) ==
          std::bit_cast<uint64_t>(eager.iterations[i].grad_norm));
    CHECK(replayed.iterations[i].skipped == eager.iterations[i].skipped);
    CHECK(replayed.iterations[i].loss_scale == eager.iterations[i].loss_scale);
    if (i >= 2) scales.insert(eager.iterations[i].loss_scale);
  }
  CHECK(scales.size() > 1);  // the scale moved during the replays
}
