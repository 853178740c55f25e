// --rollback-on-spike's bookkeeping; see spike_rollback.hpp.
#include "backend/train/spike_rollback.hpp"

#include <fmt/format.h>

#include <utility>

#include "backend/common/error.hpp"

namespace backend {

SpikeRollback::SpikeRollback(const SpikeHandlingArguments& spike,
                             CheckpointLoadOptions own_checkpoint)
    : spike_(spike),
      own_checkpoint_(std::move(own_checkpoint)),
      detector_({.threshold = spike.threshold,
                 .window = spike.window,
                 .nan_iterations = spike.nan_iterations}) {}

std::optional<Spike> SpikeRollback::observe(double lm_loss, bool nan) {
  if (!spike_.rollback_on_spike) return std::nullopt;
  return detector_.observe(lm_loss, nan);
}

std::string SpikeRollback::flags() const {
  const SpikeHandlingArguments& a = spike_;
  return fmt::format(
      "--spike-threshold {} --spike-window {} --spike-nan-iterations {} --spike-lr-factor {} "
      "--spike-max-rollbacks {}",
      a.threshold, a.window, a.nan_iterations, a.lr_factor, a.max_rollbacks);
}

CheckpointLoadOptions SpikeRollback::reload(int64_t iteration, const Spike& spike,
                                            int64_t consumed_train,
                                            int64_t last_saved_iteration) const {
  if (rollbacks_ >= spike_.max_rollbacks) {
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
        iteration, spike.reason(), own_checkpoint_.directory.string(), flags());
  }
  return own_checkpoint_;
}

void SpikeRollback::fail_checkpoint_missing(int64_t iteration, const Spike& spike,
                                            int64_t last_saved_iteration) const {
  common::fail(
      "--rollback-on-spike: spike at iteration {} ({}), but --save {} no longer holds "
      "the checkpoint of iteration {} this run saved ({} is missing)",
      iteration, spike.reason(), own_checkpoint_.directory.string(), last_saved_iteration,
      checkpoint_tracker_path(own_checkpoint_.directory).string());
}

std::string SpikeRollback::rolled_back(int64_t iteration, const Spike& spike,
                                       const TrainingProgress& reloaded, int64_t consumed_train) {
  ++rollbacks_;
  learning_rate_factor_ *= spike_.lr_factor;
  detector_.reset();
  std::string line = fmt::format(
      " rollback on spike at iteration {}: {}; reloaded iteration {} from {}, skipping samples "
      "{}..{} (rollback {} of {})",
      iteration, spike.reason(), reloaded.iteration, own_checkpoint_.directory.string(),
      reloaded.consumed_train_samples, consumed_train - 1, rollbacks_, spike_.max_rollbacks);
  if (spike_.lr_factor != 1.0) {
    line += fmt::format("; learning rate now × {}", learning_rate_factor_);
  }
  return line;
}

}  // namespace backend
