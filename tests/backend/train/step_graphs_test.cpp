// --cuda-graph-impl local through the trainer on the CPU device, whose capture records the ops'
// calls with their arguments (device.hpp): after the warm-up steps the step's forward and
// backward and its update are captured once and replayed, and every iteration's loss, gradient
// norm, learning rate and parameter norm are the eager run's bits, over a schedule whose rate
// and decay change every step (what a graph would freeze if they were arguments). A batch with
// ignored labels in the middle of the replays is replayed with its own scored count and
// classifier scale, and with dropout each replay draws each micro batch's own masks (the
// counts, scales and keys are staged in device memory, not captured), as are --fp16's loss
// scale and its inverse, which change as the scaler skips and grows. --log-num-zeros-in-grad's
// counts are the eager run's.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <sstream>
#include <string>

#include "backend/ops/cross_entropy.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "captured_log.hpp"
#include "tests/backend/train/same_iterations.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;
using test_support::check_same_iterations;

namespace {

TrainingResult train_validated(TrainingArguments a, BatchSource source = {}) {
  validate_arguments(a);
  std::ostringstream out;
  return pretrain(a, out, std::move(source));
}

// A token pattern whose labels are all scored.
void pattern(Split, int64_t first_sample, int64_t batch, std::span<int32_t> tokens,
             std::span<int32_t> labels) {
  const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t phase = first_sample + b + t;
      tokens[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(3 + 11 * (phase % 9));
      labels[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(3 + 11 * ((phase + 1) % 9));
    }
  }
}

// The pattern, but for the samples of iteration 6 (global batch 4: samples 20 .. 23), where
// one label is ignored.
void pattern_with_one_ignored_label(Split split, int64_t first_sample, int64_t batch,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
  pattern(split, first_sample, batch, tokens, labels);
  const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
  for (int64_t b = 0; b < batch; ++b) {
    if (first_sample + b == 21) labels[static_cast<size_t>(b * T + 2)] = kIgnoredLabel;
  }
}

// `eager` trained as it is and with --cuda-graph-impl local after `warmup_steps`: the same bits
// every iteration (checked here). The two results and the graphs run's log.
struct GraphsRun {
  TrainingResult eager, graphs;
  std::string log;
};
GraphsRun train_with_and_without_graphs(const TrainingArguments& eager, int64_t warmup_steps,
                                        const BatchSource& source = {}) {
  auto graphs = eager;
  graphs.cuda_graph_impl = CudaGraphImpl::local;
  graphs.cuda_graph_warmup_steps = warmup_steps;
  GraphsRun run;
  run.eager = train_validated(eager, source);
  test_support::CapturedLog log;
  run.graphs = train_validated(graphs, source);
  check_same_iterations(run.graphs, run.eager);
  run.log = log.text.str();
  return run;
}

}  // namespace

TEST_CASE("--cuda-graph-impl local replays captured steps with the eager run's bits") {
  auto eager = test_support::tiny_gpt_arguments(9);
  eager.optimizer.lr_warmup_iters = 2;
  eager.optimizer.lr_decay_style = LearningRateDecayStyle::cosine;
  eager.optimizer.weight_decay = 0.1;
  eager.logging.log_params_norm = true;
  eager.evaluation.eval_interval = 4;  // an evaluation between replays keeps the graphs
  eager.evaluation.eval_iters = 1;
  const GraphsRun run = train_with_and_without_graphs(eager, 2, pattern_with_one_ignored_label);
  const TrainingResult& expected = run.eager;
  CHECK(run.graphs.validation_loss == expected.validation_loss);
  const std::string& text = run.log;
  CAPTURE(text);
  CHECK(text.find("step: eager at iteration 1 (warm-up step 1 of 2)") != std::string::npos);
  CHECK(text.find("step: eager at iteration 2 (warm-up step 2 of 2)") != std::string::npos);
  CHECK(text.find("step: graphs captured at iteration 3 on cpu (") != std::string::npos);
  // Captured once: the steps after it replay (no second capture, no other eager step), the one
  // with an ignored label (iteration 6) too.
  CHECK(text.find("graphs captured", text.find("graphs captured") + 1) == std::string::npos);
  for (const char* iteration : {"4", "5", "6", "7", "8", "9"}) {
    CHECK(text.find(std::string("step: eager at iteration ") + iteration) == std::string::npos);
  }
  // The ignored label matters: without it the run differs from iteration 6 on.
  const TrainingResult all_scored = train_validated(eager, pattern);
  CHECK(all_scored.iterations[4].lm_loss == expected.iterations[4].lm_loss);
  CHECK(all_scored.iterations[5].lm_loss != expected.iterations[5].lm_loss);
}

TEST_CASE("with dropout, replayed steps draw each micro batch's masks of that step") {
  // Global batch 6 of micro batch 2: three micro batches a step, each with its own masks at
  // every site (keys from the dropout step, which advances every micro batch).
  auto eager = test_support::resumable_gpt_arguments(8);
  eager.run.global_batch_size = 6;
  const GraphsRun run = train_with_and_without_graphs(eager, 1);
  const TrainingResult& expected = run.eager;
  const std::string& text = run.log;
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  // Not the masks of one micro batch or of the captured step: without dropout the losses
  // differ.
  auto no_dropout = eager;
  no_dropout.model.hidden_dropout = no_dropout.model.attention_dropout = 0;
  CHECK(train_validated(no_dropout).iterations.back().lm_loss !=
        expected.iterations.back().lm_loss);
}

TEST_CASE("--calculate-per-token-loss replays each step's counts, scales and gradient factor") {
  // Each micro batch's backward scale is its scored count, the summed gradients are divided by
  // the step's: iteration 6 (an ignored label) has other counts than the rest.
  auto eager = test_support::tiny_gpt_arguments(8);
  eager.data.calculate_per_token_loss = true;
  const GraphsRun run = train_with_and_without_graphs(eager, 1, pattern_with_one_ignored_label);
  const TrainingResult& expected = run.eager;
  const std::string& text = run.log;
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 6") == std::string::npos);
  CHECK(train_validated(eager, pattern).iterations[5].grad_norm !=
        expected.iterations[5].grad_norm);
}

TEST_CASE(
    "with --fp16's dynamic loss scaler, replayed steps take each step's scale and skip "
    "the overflowing ones") {
  // Weights of std 100 make the scaled fp32 gradients overflow from 2^110: those steps are
  // skipped and the scale halves (hysteresis 1) until they fit, then doubles after two clean
  // steps and overflows again; the replays stage each step's scale, its inverse and the
  // found_inf decision.
  auto eager = test_support::tiny_gpt_arguments(12);
  eager.model.init_method_std = 100;
  eager.precision.fp16 = true;
  eager.precision.initial_loss_scale = 0x1p110;
  eager.precision.hysteresis = 1;
  eager.precision.loss_scale_window = 2;
  const GraphsRun run = train_with_and_without_graphs(eager, 1, pattern_with_one_ignored_label);
  const TrainingResult& expected = run.eager;
  const std::string& text = run.log;
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  int64_t skipped_replays = 0, clean_replays = 0;
  for (size_t i = 2; i < expected.iterations.size(); ++i) {
    ++(expected.iterations[i].skipped ? skipped_replays : clean_replays);
  }
  CHECK(skipped_replays > 0);
  CHECK(clean_replays > 0);
  CHECK(expected.iterations.back().loss_scale != expected.iterations[1].loss_scale);
  // The scale matters: from another initial scale the same run skips other steps.
  auto other_scale = eager;
  other_scale.precision.initial_loss_scale = 0x1p90;
  CHECK(train_validated(other_scale, pattern_with_one_ignored_label).iterations[2].skipped !=
        expected.iterations[2].skipped);
}

TEST_CASE("--log-num-zeros-in-grad's counts in replayed steps are the eager run's") {
  // Counted on the device after the decision, with the step's clipping factor read from its
  // memory (the replay's, not the capture's), and read with the step's other scalars.
  auto eager = test_support::tiny_gpt_arguments(6);
  eager.logging.log_num_zeros_in_grad = true;
  eager.model.untie_embeddings_and_output_weights = true;  // unseen tokens' rows get no gradient
  eager.optimizer.clip_grad = 0.05;                        // clipped: the factor changes each step
  const TrainingResult expected = train_validated(eager, pattern);
  auto graphs = eager;
  graphs.enable_cuda_graph = true;  // Megatron's older spelling of local
  graphs.cuda_graph_warmup_steps = 1;
  test_support::CapturedLog log;
  const TrainingResult replayed = train_validated(graphs, pattern);
  check_same_iterations(replayed, expected);
  const std::string text = log.text.str();
  CAPTURE(text);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 3") == std::string::npos);
  for (size_t i = 0; i < expected.iterations.size(); ++i) {
    CAPTURE(i);
    REQUIRE(expected.iterations[i].num_zeros_in_grad.has_value());
    CHECK(*expected.iterations[i].num_zeros_in_grad > 0);
    CHECK(replayed.iterations[i].num_zeros_in_grad == expected.iterations[i].num_zeros_in_grad);
  }
}
