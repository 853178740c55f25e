// --rollback-on-spike's bookkeeping (ours; docs/checkpoints.md "Loss spikes"): the detector
// (spike_detector.hpp), the rollbacks so far and the learning-rate factor they have built up,
// which checkpoint a rollback reloads (the last one this run saved in --save, with its
// optimizer state, and its RNG unless --no-save-rng left it out) and the refusals when there is
// none or the run has rolled back --spike-max-rollbacks times. The trainer does the reload and
// goes on past the samples since that checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/ckpt/checkpoint.hpp"
#include "backend/train/spike_detector.hpp"

namespace backend {

class SpikeRollback {
 public:
  // `own_checkpoint`: the load options of this run's --save directory, which a rollback
  // reloads (checkpoint_arguments.hpp's rollback_load_options).
  SpikeRollback(const SpikeHandlingArguments& spike, CheckpointLoadOptions own_checkpoint);

  // This iteration's loss judged: a spike, or nothing (always nothing without --rollback-on-spike).
  std::optional<Spike> observe(double lm_loss, bool nan);

  // What to reload after `spike` at `iteration`, when this run saved its last checkpoint at
  // `last_saved_iteration` (< 0: none yet) and has consumed `consumed_train` samples; a
  // common::Error naming the flags when it cannot roll back.
  CheckpointLoadOptions reload(int64_t iteration, const Spike& spike, int64_t consumed_train,
                               int64_t last_saved_iteration) const;
  // A common::Error: the checkpoint of `last_saved_iteration` went away before the reload.
  [[noreturn]] void fail_checkpoint_missing(int64_t iteration, const Spike& spike,
                                            int64_t last_saved_iteration) const;
  // Counts the rollback to `reloaded` (which resets the detector and lowers the learning rate
  // by --spike-lr-factor) and returns its log line.
  std::string rolled_back(int64_t iteration, const Spike& spike, const TrainingProgress& reloaded,
                          int64_t consumed_train);

  // Whether observe() judges the losses at all (--rollback-on-spike).
  bool watching() const { return spike_.rollback_on_spike; }
  int64_t rollbacks() const { return rollbacks_; }
  // --spike-lr-factor to the power of the rollbacks.
  double learning_rate_factor() const { return learning_rate_factor_; }

 private:
  std::string flags() const;

  SpikeHandlingArguments spike_;
  CheckpointLoadOptions own_checkpoint_;
  SpikeDetector detector_;
  int64_t rollbacks_ = 0;
  double learning_rate_factor_ = 1.0;
};

}  // namespace backend
