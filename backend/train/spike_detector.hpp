// --rollback-on-spike's detector (docs/checkpoints.md "Loss spikes"): after each iteration it
// says whether the iteration is a spike. Two kinds:
//   - a loss spike: lm loss > threshold × median(the last `window` finite losses), judged only
//     once `window` finite losses are known since the start or the last reset (a rollback);
//   - persistent NaN/Inf: `nan_iterations` consecutive iterations whose loss was not finite
//     (TrainStepResult::nan: in fp32 also a non-finite gradient norm). An fp16 loss scaler's
//     overflow skips are not counted: backing off the scale is the scaler's own recovery.
// A spike's loss does not enter the window (the run rolls back, which resets it). Megatron has
// no such detector (it skips NaN steps only); this is ours.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace backend {

// --rollback-on-spike and its settings (ours, pretrain_gpt only; docs/checkpoints.md "Loss
// spikes"): on a loss spike, reload the last checkpoint of --save and go on past the batches
// that caused it.
struct SpikeHandlingArguments {
  bool rollback_on_spike = false;
  double threshold = 2.0;      // --spike-threshold: lm loss > threshold × the window's median
  int64_t window = 20;         // --spike-window: iterations whose median is the reference
  int64_t nan_iterations = 3;  // --spike-nan-iterations: consecutive NaN/Inf that count
  double lr_factor = 1.0;      // --spike-lr-factor: the learning rate × this after a rollback
  int64_t max_rollbacks = 3;   // --spike-max-rollbacks: a spike after this many stops the run
  // A testing aid: this iteration's reported lm loss is multiplied by 1000 (the first time it
  // runs), so the detection sees a spike through its normal path. 0: none.
  int64_t inject_loss_spike_at_iteration = 0;
};

struct SpikeDetectorSettings {
  double threshold = 2.0;
  int64_t window = 20;
  int64_t nan_iterations = 3;
};

// What made an iteration a spike, for the rollback's line and the error after the last one.
struct Spike {
  double lm_loss = 0;
  bool nan = false;          // the NaN/Inf kind (then `median` is not used)
  double median = 0;         // the window's median, the loss kind
  int64_t nan_count = 0;     // consecutive non-finite iterations, the NaN kind
  std::string reason() const;  // "lm loss L > X × median M over the last N iterations", ...
  double threshold = 0;
  int64_t window = 0;
};

class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeDetectorSettings settings);
  // One iteration's lm loss and whether it was a NaN iteration; a spike, or nothing.
  std::optional<Spike> observe(double lm_loss, bool nan);
  // After a rollback: nothing known again.
  void reset();

 private:
  SpikeDetectorSettings settings_;
  std::deque<double> losses_;  // the last `window` finite losses
  int64_t consecutive_nan_ = 0;
};

// The median of `values` (the mean of the two middle ones for an even count); 0 when empty.
double median_of(std::deque<double> values);

}  // namespace backend
