// --rollback-on-spike: the detector's two kinds of spike, and pretrain_gpt's recovery end to end
// on a tiny mock-data run with an injected spike (docs/checkpoints.md "Loss spikes").
#include "backend/train/spike_detector.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"
#include "captured_log.hpp"
#include "temporary_directory.hpp"
#include "tests/backend/train/same_iterations.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// checkpoint_test.cpp's tiny model, 12 iterations, saving every 2, rolling back on spikes
// judged over a window of 3.
TrainingArguments spike_arguments(const std::string& save) {
  TrainingArguments a = test_support::resumable_gpt_arguments(12);
  a.checkpointing.save = save;
  a.checkpointing.save_interval = 2;
  a.spike.rollback_on_spike = true;
  a.spike.window = 3;
  a.spike.inject_loss_spike_at_iteration = 7;
  validate_arguments(a);
  return a;
}

std::vector<double> losses_of(const TrainingResult& result) {
  std::vector<double> losses;
  for (const auto& record : result.iterations) losses.push_back(record.lm_loss);
  return losses;
}

std::optional<TrainingArguments> parse_spike_run(std::vector<std::string> extra) {
  std::vector<std::string> words = {
      "pretrain_gpt", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
      "--train-iters", "10", "--lr", "1e-3", "--mock-data", "--vocab-size", "100"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  return parse_arguments(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const common::Error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("the median of the window: odd and even counts") {
  CHECK(median_of({3.0, 1.0, 2.0}) == 2.0);
  CHECK(median_of({4.0, 1.0, 2.0, 3.0}) == 2.5);
  CHECK(median_of({}) == 0.0);
}

TEST_CASE("a loss above threshold × the median is a spike once the window is full") {
  SpikeDetector detector({.threshold = 2.0, .window = 3, .nan_iterations = 3});
  CHECK_FALSE(detector.observe(1.0, false));
  CHECK_FALSE(detector.observe(1.2, false));
  // Two losses known: not judged yet, however high.
  CHECK_FALSE(detector.observe(1.1, false));
  CHECK_FALSE(detector.observe(2.1, false));  // 2.1 ≤ 2 × median(1.0, 1.2, 1.1) = 2.2
  const auto spike = detector.observe(5.0, false);  // > 2 × median(1.2, 1.1, 2.1) = 2.4
  REQUIRE(spike.has_value());
  CHECK_FALSE(spike->nan);
  CHECK(spike->median == doctest::Approx(1.2));
  CHECK(spike->reason().find("over the last 3 iterations") != std::string::npos);
  // After a reset nothing is known: the same loss is not judged.
  detector.reset();
  CHECK_FALSE(detector.observe(50.0, false));
}

TEST_CASE("consecutive NaN/Inf iterations are a spike, interrupted ones are not") {
  SpikeDetector detector({.threshold = 2.0, .window = 20, .nan_iterations = 3});
  CHECK_FALSE(detector.observe(kNan, true));
  CHECK_FALSE(detector.observe(kNan, true));
  CHECK_FALSE(detector.observe(1.0, false));  // the count starts over
  CHECK_FALSE(detector.observe(std::numeric_limits<double>::infinity(), false));
  CHECK_FALSE(detector.observe(1.0, true));  // a skipped, non-finite-norm iteration counts
  const auto spike = detector.observe(kNan, true);
  REQUIRE(spike.has_value());
  CHECK(spike->nan);
  CHECK(spike->nan_count == 3);
  CHECK(spike->reason() == "3 consecutive iterations with a NaN/Inf lm loss");
}

TEST_CASE("--rollback-on-spike: an injected spike rolls back to the last checkpoint and the run "
          "ends at --train-iters") {
  test_support::TemporaryDirectory directory;
  const TrainingArguments a = spike_arguments(directory.path.string());
  std::ostringstream log;
  const TrainingResult result = pretrain(a, log);
  const std::string text = log.str();
  INFO(text);
  // Iterations 1..7 (7 the spike), then 7..12 again from the checkpoint of iteration 6.
  REQUIRE(result.iterations.size() == 13);
  CHECK(result.iterations[6].iteration == 7);
  CHECK(result.iterations[7].iteration == 7);
  CHECK(result.iterations.back().iteration == 12);
  CHECK(text.find(" rollback on spike at iteration 7: lm loss ") != std::string::npos);
  CHECK(text.find("; reloaded iteration 6 from " + a.checkpointing.save +
                  ", skipping samples 24..27 "
                  "(rollback 1 of 3)") != std::string::npos);
  // The data is not rewound: the re-run iteration 7 reads the samples after the spike's.
  CHECK(result.iterations[6].consumed_samples == 28);
  CHECK(result.iterations[7].consumed_samples == 32);
  CHECK(result.iterations.back().consumed_samples == 13 * 4);
  // The losses after the recovery are finite and near those before the spike.
  const double before = result.iterations[5].lm_loss;
  for (size_t index = 7; index < result.iterations.size(); ++index) {
    CHECK(std::isfinite(result.iterations[index].lm_loss));
    CHECK(result.iterations[index].lm_loss < 1.2 * before);
  }
  CHECK(result.iterations[6].lm_loss > 100 * before);

  SUBCASE("the same seed and flags recover the same way") {
    test_support::TemporaryDirectory again_directory;
    TrainingArguments again = a;
    again.checkpointing.save = again_directory.path.string();
    std::ostringstream again_log;
    CHECK(losses_of(pretrain(again, again_log)) == losses_of(result));
  }
}

TEST_CASE("--rollback-on-spike under --cuda-graph-impl local: replays, a rollback, replays again") {
  // The reload changes the master weights under the graphs (whose update wrote the 16-bit
  // copy): the steps after it warm up and capture again, and every iteration is the eager
  // run's, the spike's and the re-run ones with --spike-lr-factor's rate included.
  test_support::TemporaryDirectory eager_directory;
  TrainingArguments eager = spike_arguments(eager_directory.path.string());
  eager.spike.lr_factor = 0.5;
  std::ostringstream eager_log;
  const TrainingResult expected = pretrain(eager, eager_log);
  REQUIRE(expected.iterations.size() == 13);
  test_support::TemporaryDirectory graphs_directory;
  TrainingArguments graphs = eager;
  graphs.checkpointing.save = graphs_directory.path.string();
  graphs.cuda_graph_impl = CudaGraphImpl::local;
  graphs.cuda_graph_warmup_steps = 1;
  std::ostringstream graphs_log;
  test_support::CapturedLog log;
  const TrainingResult replayed = pretrain(graphs, graphs_log);
  test_support::check_same_iterations(replayed, expected);
  const std::string text = log.text.str();
  CAPTURE(text);
  // Captured at iteration 2 and replayed up to the spike (the injection drops the graphs at
  // 7, which runs eagerly and spikes); the rollback drops them again, so the re-run 7 warms up
  // and 8 is captured anew.
  CHECK(graphs_log.str().find(" rollback on spike at iteration 7: lm loss ") != std::string::npos);
  CHECK(text.find("step: graphs captured at iteration 2 on cpu (") != std::string::npos);
  CHECK(text.find("step: eager at iteration 7 (warm-up step 1 of 1)") != std::string::npos);
  CHECK(text.find("step: graphs captured at iteration 8 on cpu (") != std::string::npos);
}

TEST_CASE("without --rollback-on-spike the injected spike passes") {
  test_support::TemporaryDirectory directory;
  TrainingArguments a = spike_arguments(directory.path.string());
  a.spike.rollback_on_spike = false;
  std::ostringstream log;
  const TrainingResult result = pretrain(a, log);
  REQUIRE(result.iterations.size() == 12);
  CHECK(result.iterations[6].lm_loss > 100 * result.iterations[5].lm_loss);
  // The damage is real: without the rollback the run does not get back to where it stood.
  CHECK(result.iterations.back().lm_loss > 2 * result.iterations[5].lm_loss);
  CHECK(log.str().find("rollback") == std::string::npos);
}

TEST_CASE("--spike-lr-factor scales the learning rate after a rollback, TensorBoard has it") {
  test_support::TemporaryDirectory directory;
  test_support::TemporaryDirectory tensorboard;
  TrainingArguments a = spike_arguments(directory.path.string());
  a.spike.lr_factor = 0.5;
  a.logging.tensorboard_dir = tensorboard.path.string();
  std::ostringstream log;
  const TrainingResult result = pretrain(a, log);
  REQUIRE(result.iterations.size() == 13);
  // Iteration 7 before and after the rollback: the same scheduler step, half the rate.
  CHECK(result.iterations[7].learning_rate ==
        doctest::Approx(0.5 * result.iterations[6].learning_rate));
  CHECK(log.str().find("learning rate now × 0.5") != std::string::npos);
  // The event file holds the scalar `rollbacks` (its tag's bytes, once written).
  std::string events;
  for (const auto& entry : std::filesystem::directory_iterator(tensorboard.path)) {
    std::ifstream file(entry.path(), std::ios::binary);
    events += std::string(std::istreambuf_iterator<char>(file), {});
  }
  CHECK(events.find("rollbacks") != std::string::npos);
}

TEST_CASE("--spike-max-rollbacks exceeded stops the run naming the spike and the flags") {
  test_support::TemporaryDirectory directory;
  TrainingArguments a = spike_arguments(directory.path.string());
  a.spike.max_rollbacks = 0;
  std::ostringstream log;
  const std::string message = error_of([&] { pretrain(a, log); });
  CHECK(message.find("spike at iteration 7 (lm loss ") != std::string::npos);
  CHECK(message.find("× median ") != std::string::npos);
  CHECK(message.find("--spike-max-rollbacks 0") != std::string::npos);
}

TEST_CASE("persistent NaN/Inf losses roll back too, and stop the run after the last rollback") {
  test_support::TemporaryDirectory directory;
  TrainingArguments a = spike_arguments(directory.path.string());
  // A learning rate no model survives: from iteration 2 on every loss is NaN/Inf.
  a.optimizer.lr = 1e10;
  a.optimizer.lr_warmup_iters = 0;
  a.optimizer.clip_grad = 0;
  a.spike.inject_loss_spike_at_iteration = 0;
  a.spike.threshold = 1e300;  // the NaN kind alone
  a.spike.max_rollbacks = 1;
  validate_arguments(a);
  std::ostringstream log;
  const std::string message = error_of([&] { pretrain(a, log); });
  INFO(log.str());
  CHECK(log.str().find(" rollback on spike at iteration 4: 3 consecutive iterations with a "
                       "NaN/Inf lm loss; reloaded iteration 2 from ") != std::string::npos);
  CHECK(message.find("(3 consecutive iterations with a NaN/Inf lm loss) after 1 rollback(s)") !=
        std::string::npos);
}

TEST_CASE("a spike before this run saved any checkpoint is refused") {
  test_support::TemporaryDirectory directory;
  TrainingArguments a = spike_arguments(directory.path.string());
  a.checkpointing.save_interval = 10;
  std::ostringstream log;
  const std::string message = error_of([&] { pretrain(a, log); });
  CHECK(message.find("has saved no checkpoint in --save") != std::string::npos);
}

TEST_CASE("--rollback-on-spike flags: --save needed, values checked") {
  CHECK(error_of([] { parse_spike_run({"--rollback-on-spike"}); }).find("--rollback-on-spike needs --save") !=
        std::string::npos);
  CHECK(error_of([] { parse_spike_run({"--rollback-on-spike", "--save", "/tmp/x", "--no-save-optim"}); })
            .find("--no-save-optim") != std::string::npos);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--spike-threshold", "1"},
        std::vector<std::string>{"--spike-threshold", "nan"},
        std::vector<std::string>{"--spike-window", "0"},
        std::vector<std::string>{"--spike-nan-iterations", "0"},
        std::vector<std::string>{"--spike-lr-factor", "0"},
        std::vector<std::string>{"--spike-lr-factor", "1.5"},
        std::vector<std::string>{"--spike-max-rollbacks", "-1"},
        std::vector<std::string>{"--inject-loss-spike-at-iteration", "0"}}) {
    CHECK(error_of([&] { parse_spike_run(bad); }).find(bad[0]) != std::string::npos);
  }
  const auto parsed = parse_spike_run({"--rollback-on-spike", "--save", "/tmp/x", "--spike-threshold", "3",
                             "--spike-window", "5", "--spike-nan-iterations", "2",
                             "--spike-lr-factor", "0.5", "--spike-max-rollbacks", "4"});
  REQUIRE(parsed.has_value());
  CHECK(parsed->spike.rollback_on_spike);
  CHECK(parsed->spike.threshold == 3.0);
  CHECK(parsed->spike.window == 5);
  CHECK(parsed->spike.nan_iterations == 2);
  CHECK(parsed->spike.lr_factor == 0.5);
  CHECK(parsed->spike.max_rollbacks == 4);
  // Off by default.
  const auto plain = parse_spike_run({});
  REQUIRE(plain.has_value());
  CHECK_FALSE(plain->spike.rollback_on_spike);
}
