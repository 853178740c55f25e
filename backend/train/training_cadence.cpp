// Megatron's evaluation, checkpoint and exit cadence; see training_cadence.hpp.
#include "backend/train/training_cadence.hpp"

#include <algorithm>

namespace backend {

IterationActions actions_after_iteration(const TrainingArguments& a, int64_t iteration,
                                         ExitConditions conditions) {
  IterationActions actions;
  // --eval-interval is read only when evaluating: with --eval-iters 0 it may be anything.
  actions.evaluate = a.evaluation.eval_iters > 0 && iteration % a.evaluation.eval_interval == 0 &&
                     iteration != a.run.train_iters && !conditions.exit_signal_received;
  actions.exit = (a.run.exit_interval > 0 && iteration % a.run.exit_interval == 0) ||
                 conditions.duration_exceeded || conditions.exit_signal_received;
  const bool save_interval_reached =
      a.checkpointing.save_interval > 0 && iteration % a.checkpointing.save_interval == 0;
  actions.save = !a.checkpointing.save.empty() && (save_interval_reached || actions.exit);
  return actions;
}

std::optional<int64_t> iteration_to_save_at_end(const TrainingArguments& a,
                                                int64_t resumed_iteration,
                                                int64_t last_saved_iteration) {
  // A run resumed past --train-iters trains no further; its checkpoint is the one it loaded.
  const int64_t last_iteration = std::max(resumed_iteration, a.run.train_iters);
  if (a.checkpointing.save.empty() || last_iteration <= 0 ||
      last_saved_iteration == last_iteration) {
    return std::nullopt;
  }
  return last_iteration;
}

}  // namespace backend
