// The evaluation, checkpoint and exit cadence as Megatron's train() decides it, one decision
// at a time: which iterations evaluate, save and exit, and what is saved when the loop ends.
#include <doctest/doctest.h>

#include <vector>

#include "backend/train/training_cadence.hpp"

using namespace backend;

namespace {

TrainingArguments cadence_arguments() {
  TrainingArguments a;
  a.run.train_iters = 20;
  a.evaluation.eval_iters = 2;
  a.evaluation.eval_interval = 5;
  return a;
}

// The iterations in 1 .. train_iters for which `chosen` holds.
template <typename Chosen>
std::vector<int64_t> iterations_where(const TrainingArguments& a, Chosen chosen) {
  std::vector<int64_t> iterations;
  for (int64_t i = 1; i <= a.run.train_iters; ++i) {
    if (chosen(actions_after_iteration(a, i))) iterations.push_back(i);
  }
  return iterations;
}

const auto evaluates = [](const IterationActions& actions) { return actions.evaluate; };
const auto saves = [](const IterationActions& actions) { return actions.save; };
const auto exits = [](const IterationActions& actions) { return actions.exit; };

}  // namespace

TEST_CASE("validation every --eval-interval, but not at --train-iters: that has the final pass") {
  const auto a = cadence_arguments();
  CHECK(iterations_where(a, evaluates) == std::vector<int64_t>{5, 10, 15});
  auto uneven = a;
  uneven.run.train_iters = 22;
  CHECK(iterations_where(uneven, evaluates) == std::vector<int64_t>{5, 10, 15, 20});
}

TEST_CASE("--eval-iters 0 never evaluates, and then --eval-interval is not read") {
  auto a = cadence_arguments();
  a.evaluation.eval_iters = 0;
  CHECK(iterations_where(a, evaluates).empty());
  a.evaluation.eval_interval = 0;  // a modulo by it would fault
  CHECK(iterations_where(a, evaluates).empty());
}

TEST_CASE("checkpoints every --save-interval, only with --save") {
  auto a = cadence_arguments();
  a.checkpointing.save_interval = 6;
  CHECK(iterations_where(a, saves).empty());
  a.checkpointing.save = "/checkpoints";
  CHECK(iterations_where(a, saves) == std::vector<int64_t>{6, 12, 18});
  a.checkpointing.save_interval = 0;  // none by the interval; the end of training saves
  CHECK(iterations_where(a, saves).empty());
}

TEST_CASE("--exit-interval exits at its multiples, saving there whatever --save-interval says") {
  auto a = cadence_arguments();
  a.run.exit_interval = 7;
  CHECK(iterations_where(a, exits) == std::vector<int64_t>{7, 14});
  CHECK(iterations_where(a, saves).empty());  // no --save: exit without saving
  a.checkpointing.save = "/checkpoints";
  a.checkpointing.save_interval = 3;
  CHECK(iterations_where(a, saves) == std::vector<int64_t>{3, 6, 7, 9, 12, 14, 15, 18});
  const IterationActions at_exit = actions_after_iteration(a, 7);
  CHECK(at_exit.save);
  CHECK(at_exit.exit);
  CHECK_FALSE(at_exit.evaluate);
  a.run.exit_interval = 0;
  CHECK(iterations_where(a, exits).empty());
}

TEST_CASE("an iteration can evaluate, save and exit at once") {
  auto a = cadence_arguments();
  a.checkpointing.save = "/checkpoints";
  a.checkpointing.save_interval = 10;
  a.run.exit_interval = 10;
  const IterationActions actions = actions_after_iteration(a, 10);
  CHECK(actions.evaluate);
  CHECK(actions.save);
  CHECK(actions.exit);
  const IterationActions between = actions_after_iteration(a, 9);
  CHECK_FALSE(between.evaluate);
  CHECK_FALSE(between.save);
  CHECK_FALSE(between.exit);
}

TEST_CASE("the end of training saves --train-iters unless --save already holds it") {
  auto a = cadence_arguments();
  CHECK_FALSE(iteration_to_save_at_end(a, 0, -1).has_value());  // no --save
  a.checkpointing.save = "/checkpoints";
  CHECK(iteration_to_save_at_end(a, 0, -1) == 20);
  CHECK(iteration_to_save_at_end(a, 0, 18) == 20);              // an earlier interval's save
  CHECK_FALSE(iteration_to_save_at_end(a, 0, 20).has_value());  // the interval saved it
  CHECK(iteration_to_save_at_end(a, 8, 8) == 20);               // resumed from --save, trained on
}

TEST_CASE("a run resumed at or past --train-iters saves what it loaded into another directory") {
  auto a = cadence_arguments();
  a.checkpointing.save = "/checkpoints";
  CHECK(iteration_to_save_at_end(a, 25, -1) == 25);              // --load elsewhere
  CHECK_FALSE(iteration_to_save_at_end(a, 25, 25).has_value());  // --load is --save
  CHECK_FALSE(iteration_to_save_at_end(a, 20, 20).has_value());
}

TEST_CASE("nothing trained and nothing loaded: nothing to save") {
  auto a = cadence_arguments();
  a.checkpointing.save = "/checkpoints";
  a.run.train_iters = 0;
  CHECK_FALSE(iteration_to_save_at_end(a, 0, -1).has_value());
}

TEST_CASE("--exit-duration-in-mins: an iteration past the limit exits, saving first with --save") {
  auto a = cadence_arguments();
  const IterationActions within = actions_after_iteration(a, 4, {.duration_exceeded = false});
  CHECK_FALSE(within.exit);
  const IterationActions past = actions_after_iteration(a, 4, {.duration_exceeded = true});
  CHECK(past.exit);
  CHECK_FALSE(past.save);  // nowhere to save
  a.checkpointing.save = "/checkpoints";
  CHECK(actions_after_iteration(a, 4, {.duration_exceeded = true}).save);
}

TEST_CASE("--exit-signal-handler: a SIGTERM exits after the iteration, saving before validating") {
  auto a = cadence_arguments();
  a.evaluation.eval_iters = 2;
  a.evaluation.eval_interval = 5;
  const ExitConditions signalled{.exit_signal_received = true};
  const IterationActions nowhere = actions_after_iteration(a, 3, signalled);
  CHECK(nowhere.exit);
  CHECK_FALSE(nowhere.save);  // no --save: it stops all the same
  a.checkpointing.save = "/checkpoints";
  const IterationActions saved = actions_after_iteration(a, 3, signalled);
  CHECK(saved.exit);
  CHECK(saved.save);
  // An --eval-interval iteration: the notice before SIGKILL goes to the checkpoint.
  const IterationActions at_interval = actions_after_iteration(a, 5, signalled);
  CHECK(at_interval.save);
  CHECK(at_interval.exit);
  CHECK_FALSE(at_interval.evaluate);
  CHECK(actions_after_iteration(a, 5).evaluate);
}
