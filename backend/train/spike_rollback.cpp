// --rollback-on-spike's bookkeeping; see spike_rollback.hpp.
#include "backend/train/spike_rollback.hpp"

#include <fmt/format.h>

#include "backend/common/error.hpp"
#include "backend/train/checkpoint_arguments.hpp"

namespace backend {

SpikeRollback::SpikeRollback(const TrainingArguments& arguments)
    : arguments_(arguments),
      detector_({.threshold = arguments.spike.threshold,
                 .window = arguments.spike.window,
                 .nan_iterations = arguments.spike.nan_iterations}) {}

std::optional<Spike> SpikeRollback::observe(double lm_loss, bool nan) {
  if (!arguments_.spike.rollback_on_spike) return std::nullopt;
  return detector_.observe(lm_loss, nan);
}

std::string SpikeRollback::flags() const {
  const TrainingArguments& a = arguments_;
  return fmt::format(
      "--spike-threshold {} --spike-window {} --spike-nan-iterations {} --spike-lr-factor {} "
      "--spike-max-rollbacks {}",
      a.spike.threshold, a.spike.window, a.spike.nan_iterations, a.spike.lr_factor,
      a.spike.max_rollbacks);
}

CheckpointLoadOptions SpikeRollback::reload(int64_t iteration, const Spike& spike,
                                            int64_t consumed_train,
                                            int64_t last_saved_iteration) const {
  const TrainingArguments& a = arguments_;
  if (rollbacks_ >= a.spike.max_rollbacks) {
    common::fail("--rollback-on-spike: spike at iteration {} ({}) after {} rollback(s), the most "
                 "--spike-max-rollbacks allows; stopping ({}). The run does not recover by "
                 "rolling back: lower --lr, raise --spike-max-rollbacks or --spike-threshold, "
                 "or look at the data around consumed sample {}",
                 iteration, spike.reason(), rollbacks_, flags(), consumed_train);
  }
  if (last_saved_iteration < 0) {
    common::fail(
        "--rollback-on-spike: spike at iteration {} ({}), but this run has saved no "
        "checkpoint in --save {} yet to roll back to ({}); save sooner with a smaller "
        "--save-interval",
        iteration, spike.reason(), a.checkpointing.save, flags());
  }
  // The run's own checkpoint, whole: weights, optimizer and scheduler, and the dropout RNG
  // where the save kept it.
  CheckpointLoadOptions options = checkpoint_load_options(a);
  options.directory = a.checkpointing.save;
  options.finetune = false;
  options.no_load_optim = false;
  options.no_load_rng = a.checkpointing.no_save_rng;
  return options;
}

void SpikeRollback::fail_checkpoint_missing(int64_t iteration, const Spike& spike,
                                            int64_t last_saved_iteration) const {
  common::fail(
      "--rollback-on-spike: spike at iteration {} ({}), but --save {} no longer holds "
      "the checkpoint of iteration {} this run saved ({} is missing)",
      iteration, spike.reason(), arguments_.checkpointing.save, last_saved_iteration,
      checkpoint_tracker_path(arguments_.checkpointing.save).string());
}

std::string SpikeRollback::rolled_back(int64_t iteration, const Spike& spike,
                                       const TrainingProgress& reloaded, int64_t consumed_train) {
  const TrainingArguments& a = arguments_;
  ++rollbacks_;
  learning_rate_factor_ *= a.spike.lr_factor;
  detector_.reset();
  std::string line = fmt::format(
      " rollback on spike at iteration {}: {}; reloaded iteration {} from {}, skipping samples "
      "{}..{} (rollback {} of {})",
      iteration, spike.reason(), reloaded.iteration, a.checkpointing.save,
      reloaded.consumed_train_samples, consumed_train - 1, rollbacks_, a.spike.max_rollbacks);
  if (a.spike.lr_factor != 1.0) {
    line += fmt::format("; learning rate now × {}", learning_rate_factor_);
  }
  return line;
}

}  // namespace backend
