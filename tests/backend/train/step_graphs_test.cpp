// --cuda-graph-impl local through the trainer on the CPU device, whose capture records the ops'
// calls with their arguments (device.hpp): after the warm-up steps the step's forward and
// backward and its update are captured once and replayed, and every iteration's loss, gradient
// norm, learning rate and parameter norm are the eager run's bits, over a schedule whose rate
// and decay change every step (what a graph would freeze if they were arguments). A batch with
// ignored labels runs eagerly in the middle of the replays; layouts and options graphs do not
// cover yet run eagerly, saying why, with the eager run's results.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <sstream>
#include <string>

#include "backend/ops/cross_entropy.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "captured_log.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

TrainingResult train_validated(TrainingArguments a, BatchSource source = {}) {
  validate_arguments(a);
  std::ostringstream out;
  return pretrain(a, out, std::move(source));
}

// Two runs' iterations: the same bits in every logged value.
void check_same_iterations(const TrainingResult& actual, const TrainingResult& expected) {
  REQUIRE(actual.iterations.size() == expected.iterations.size());
  for (size_t i = 0; i < expected.iterations.size(); ++i) {
    CAPTURE(i);
    CHECK(actual.iterations[i].lm_loss == expected.iterations[i].lm_loss);
    CHECK(actual.iterations[i].grad_norm == expected.iterations[i].grad_norm);
    CHECK(actual.iterations[i].learning_rate == expected.iterations[i].learning_rate);
    CHECK(actual.iterations[i].params_norm == expected.iterations[i].params_norm);
    CHECK(actual.iterations[i].skipped == expected.iterations[i].skipped);
  }
}

// A token pattern whose labels are all scored, but for the samples of iteration 6 (global
// batch 4: samples 20 .. 23), where one label is ignored.
void pattern_with_one_ignored_label(Split, int64_t first_sample, int64_t batch,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
  const int64_t T = static_cast<int64_t>(tokens.size()) / batch;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t phase = first_sample + b + t;
      tokens[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(3 + 11 * (phase % 9));
      labels[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(3 + 11 * ((phase + 1) % 9));
    }
    if (first_sample + b == 21) labels[static_cast<size_t>(b * T + 2)] = kIgnoredLabel;
  }
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
  auto graphs = eager;
  graphs.cuda_graph_impl = CudaGraphImpl::local;
  graphs.cuda_graph_warmup_steps = 2;
  const TrainingResult expected = train_validated(eager, pattern_with_one_ignored_label);
  test_support::CapturedLog log;
  const TrainingResult actual = train_validated(graphs, pattern_with_one_ignored_label);
  check_same_iterations(actual, expected);
  CHECK(actual.validation_loss == expected.validation_loss);
  const std::string text = log.text.str();
  CAPTURE(text);
  CHECK(text.find("step: eager at iteration 1 (warm-up step 1 of 2)") != std::string::npos);
  CHECK(text.find("step: eager at iteration 2 (warm-up step 2 of 2)") != std::string::npos);
  CHECK(text.find("step: graphs captured at iteration 3 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 6 (a micro batch with ignored labels") !=
        std::string::npos);
  // Captured once: the steps after it replay (no second capture, no other eager step).
  CHECK(text.find("graphs captured", text.find("graphs captured") + 1) == std::string::npos);
  CHECK(text.find("step: eager at iteration 4") == std::string::npos);
  CHECK(text.find("step: eager at iteration 7") == std::string::npos);
}

TEST_CASE("steps that graphs do not cover yet run eagerly, saying why, with the eager bits") {
  auto dropout = test_support::tiny_gpt_arguments(4);
  dropout.model.hidden_dropout = dropout.model.attention_dropout = 0.1;
  auto per_token = test_support::tiny_gpt_arguments(4);
  per_token.data.calculate_per_token_loss = true;
  struct Case {
    TrainingArguments arguments;
    const char* reason;
  };
  for (const Case& c : {Case{dropout, "(dropout: the masks' keys are arguments"},
                        Case{per_token, "(--calculate-per-token-loss: each backward's scale"}}) {
    CAPTURE(c.reason);
    const TrainingResult expected = train_validated(c.arguments);
    auto graphs = c.arguments;
    graphs.enable_cuda_graph = true;  // Megatron's older spelling of local
    test_support::CapturedLog log;
    check_same_iterations(train_validated(graphs), expected);
    const std::string text = log.text.str();
    CHECK(text.find(std::string("step: eager at iteration 1 ") + c.reason) != std::string::npos);
    CHECK(text.find("step: eager at iteration 2") == std::string::npos);  // said once
    CHECK(text.find("captured") == std::string::npos);
  }
}
