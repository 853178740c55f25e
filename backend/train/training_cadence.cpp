// Megatron's evaluation, checkpoint and exit cadence; see training_cadence.hpp.
#include "backend/train/training_cadence.hpp"

#include <algorithm>

namespace backend {

IterationActions actions_after_iteration(const TrainingArguments& a, int64_t iteration,
                                         ExitConditions conditions) {
  IterationActions actions;
  // --eval-interval is read only when evaluating: with --eval-iters 0 it may be anything.
  actions.evaluate = a.eval_iters > 0 && iteration % a.eval_interval == 0 &&
                     iteration != a.train_iters && !conditions.exit_signal_received;
  actions.exit = (a.exit_interval > 0 && iteration % a.exit_interval == 0) ||
                 conditions.duration_exceeded || conditions.exit_signal_received;
  const bool save_interval_reached = a.save_interval > 0 && iteration % a.save_interval == 0;
  actions.save = !a.save.empty() && (save_interval_reached || actions.exit);
  return actions;
}

std::optional<int64_t> iteration_to_save_at_end(const TrainingArguments& a,
                                                int64_t resumed_iteration,
                                                int64_t last_saved_iteration) {
  // A run resumed past --train-iters trains no further; its checkpoint is the one it loaded.
  const int64_t last_iteration = std::max(resumed_iteration, a.train_iters);
  if (a.save.empty() || last_iteration <= 0 || last_saved_iteration == last_iteration) {
    return std::nullopt;
  }
  return last_iteration;
}

}  // namespace backend
