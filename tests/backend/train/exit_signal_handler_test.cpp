// --exit-signal-handler (train/exit_signal_handler.hpp): SIGTERM is noted, not fatal, while the
// handler lives, and the disposition it found comes back after; a run that gets SIGTERM saves
// after that iteration and exits, and its resumption equals a run that never stopped, bit for
// bit. The signal is raised from inside the run (its data source), at a known iteration;
// tests/e2e/data_parallel_test.cpp sends it from outside to one rank of two.
#include "backend/train/exit_signal_handler.hpp"

#include <doctest/doctest.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/common/error.hpp"
#include "backend/data/mock_dataset.hpp"
#include "backend/train/trainer.hpp"
#include "temporary_directory.hpp"
#include "tests/backend/train/tiny_gpt_arguments.hpp"

using namespace backend;

namespace {

// Whether SIGTERM is ignored now.
bool termination_ignored() {
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  return now.sa_handler == SIG_IGN;
}

// A restorer of SIG_IGN for SIGTERM while a case runs, so that a signal raised with no handler
// of ours in place is ignored rather than fatal to the test process.
struct IgnoredTermination {
  struct sigaction previous {};
  IgnoredTermination() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGTERM, &ignore, &previous);
  }
  ~IgnoredTermination() { sigaction(SIGTERM, &previous, nullptr); }
};

TrainingArguments signalled_arguments() {
  TrainingArguments a = test_support::resumable_gpt_arguments(8);
  a.run.exit_signal_handler = true;
  validate_arguments(a);
  return a;
}

// The mock data pretrain() reads, raising SIGTERM while it reads the first micro batch of
// iteration `signal_at` (0: never).
BatchSource signalling_source(const TrainingArguments& a, int64_t signal_at) {
  auto data =
      std::make_shared<MockDataset>(a.run.seed, a.tokenizer.vocab_size + 1, a.model.seq_length);
  const int64_t trigger = (signal_at - 1) * a.run.global_batch_size;
  return [data, trigger, signal_at](Split split, int64_t first_sample, int64_t batch_size,
                                    std::span<int32_t> tokens, std::span<int32_t> labels) {
    if (signal_at > 0 && split == Split::train && first_sample == trigger) raise(SIGTERM);
    data->fill_batch(split, first_sample, batch_size, tokens, labels);
  };
}

}  // namespace

TEST_CASE("ExitSignalHandler notes SIGTERM, is alone, and restores the disposition it found") {
  const IgnoredTermination ignored;
  CHECK(termination_ignored());
  {
    const ExitSignalHandler handler;
    CHECK_FALSE(handler.received());
    CHECK_FALSE(termination_ignored());
    CHECK_THROWS_AS(ExitSignalHandler(), std::logic_error);
    raise(SIGTERM);  // would end the test process if the handler were not in place
    CHECK(handler.received());
  }
  CHECK(termination_ignored());
  // A new one starts with nothing received.
  const ExitSignalHandler again;
  CHECK_FALSE(again.received());
}

TEST_CASE("a run that gets SIGTERM saves after that iteration, exits, and resumes bit for bit") {
  const IgnoredTermination ignored;
  test_support::TemporaryDirectory directory;
  const TrainingArguments base = signalled_arguments();

  auto uninterrupted = base;
  uninterrupted.checkpointing.save = (directory.path / "uninterrupted").string();
  std::ostringstream log_whole;
  const TrainingResult whole = pretrain(uninterrupted, log_whole, signalling_source(base, 0));
  REQUIRE(whole.iterations.size() == 8);

  auto first_half = base;
  first_half.checkpointing.save = (directory.path / "resumed").string();
  std::ostringstream log_first;
  const TrainingResult first = pretrain(first_half, log_first, signalling_source(base, 3));
  CHECK(first.iterations.size() == 3);
  CHECK(log_first.str().find("[exiting program after receiving SIGTERM.] datetime: ") !=
        std::string::npos);
  CHECK(read_checkpoint_tracker(first_half.checkpointing.save)->iteration == 3);
  CHECK(termination_ignored());  // the run's handler is gone with the run

  auto second_half = base;
  second_half.checkpointing.save = second_half.checkpointing.load = first_half.checkpointing.save;
  std::ostringstream log_second;
  const TrainingResult second = pretrain(second_half, log_second, signalling_source(base, 0));
  REQUIRE(second.iterations.size() == 5);
  // Each iteration's (number, loss, gradient norm), exactly.
  auto trace = [](const std::vector<IterationRecord>& iterations) {
    std::vector<std::tuple<int64_t, double, double>> values;
    for (const auto& record : iterations) {
      values.emplace_back(record.iteration, record.lm_loss, record.grad_norm);
    }
    return values;
  };
  auto joined = trace(first.iterations);
  for (const auto& value : trace(second.iterations)) joined.push_back(value);
  CHECK(joined == trace(whole.iterations));
}

TEST_CASE("--exit-signal: another notice signal (sbatch --signal=USR1@300) stops the run the same way") {
  CHECK(exit_signal_number("SIGUSR1") == SIGUSR1);
  CHECK(exit_signal_number("SIGTERM") == SIGTERM);
  CHECK_FALSE(exit_signal_number("SIGKILL").has_value());  // cannot be caught
  CHECK_FALSE(exit_signal_number("USR1").has_value());     // Python's names only
  auto a = signalled_arguments();
  a.run.exit_signal = "SIGUSR1";
  // The run's handler takes SIGUSR1; the data source raises it at iteration 2.
  auto data =
      std::make_shared<MockDataset>(a.run.seed, a.tokenizer.vocab_size + 1, a.model.seq_length);
  const BatchSource source = [data, &a](Split split, int64_t first_sample, int64_t batch_size,
                                        std::span<int32_t> tokens, std::span<int32_t> labels) {
    if (split == Split::train && first_sample == a.run.global_batch_size) raise(SIGUSR1);
    data->fill_batch(split, first_sample, batch_size, tokens, labels);
  };
  std::ostringstream log;
  const TrainingResult result = pretrain(a, log, source);
  CHECK(result.iterations.size() == 2);
  CHECK(log.str().find("[exiting program after receiving SIGUSR1.]") != std::string::npos);
}

TEST_CASE("without --save a SIGTERM stops the run after the iteration and saves nothing") {
  const IgnoredTermination ignored;
  auto a = signalled_arguments();
  std::ostringstream log;
  const TrainingResult result = pretrain(a, log, signalling_source(a, 2));
  CHECK(result.iterations.size() == 2);
  CHECK(log.str().find("saving checkpoint") == std::string::npos);
  CHECK(log.str().find("[exiting program after receiving SIGTERM.]") != std::string::npos);
}

TEST_CASE("--exit-on-missing-checkpoint: a --load without a checkpoint stops the run") {
  test_support::TemporaryDirectory directory;
  auto a = signalled_arguments();
  a.run.exit_signal_handler = false;
  a.checkpointing.load = (directory.path / "typo").string();
  a.checkpointing.exit_on_missing_checkpoint = true;
  std::ostringstream log;
  const std::string refusal = "--load " + a.checkpointing.load + " holds no checkpoint";
  CHECK_THROWS_WITH_AS(pretrain(a, log), doctest::Contains(refusal.c_str()), common::Error);
  CHECK(log.str().find("iteration") == std::string::npos);  // nothing trained
  // Without the flag: Megatron's warning and a start from scratch.
  a.checkpointing.exit_on_missing_checkpoint = false;
  a.run.train_iters = 1;
  std::ostringstream started;
  CHECK(pretrain(a, started).iterations.size() == 1);
  CHECK(started.str().find("will not load any checkpoints and will start from random") !=
        std::string::npos);
}
