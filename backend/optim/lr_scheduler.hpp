// Megatron-LM's learning-rate schedule (megatron/core/optimizer_param_scheduler.py,
// OptimizerParamScheduler.get_lr), counted in samples as Megatron counts it:
//   warmup  (num_steps ≤ warmup_steps): lr = init + (max − init) · num_steps / warmup_steps
//   constant:                           lr = max
//   after decay_steps:                  lr = min
//   otherwise, r = (num_steps − warmup_steps) / (decay_steps − warmup_steps):
//     linear  lr = min + (max − min) · (1 − r)
//     cosine  lr = min + (max − min) · 0.5 · (cos(π r) + 1)
// where warmup_steps = lr_warmup_iters · global_batch_size and decay_steps likewise.
// step(increment) is called after each successful optimizer step with the global batch
// size, so the rate logged on iteration N is the one iteration N+1 will use, as in Megatron.
#pragma once

#include <cstdint>
#include <string>

namespace backend {

struct LearningRateSchedule {
  double max_lr = 0;
  double min_lr = 0;
  double init_lr = 0;  // --lr-warmup-init
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
  std::string decay_style = "linear";  // constant | linear | cosine
};

class LearningRateScheduler {
 public:
  explicit LearningRateScheduler(const LearningRateSchedule& schedule);
  double learning_rate() const;  // for the current num_steps
  void step(int64_t increment);
  int64_t num_steps() const { return num_steps_; }
  const LearningRateSchedule& schedule() const { return schedule_; }
  // Restoring a checkpoint: the schedule continues from this many samples.
  void set_num_steps(int64_t num_steps);

 private:
  LearningRateSchedule schedule_;
  int64_t num_steps_ = 0;
};

}  // namespace backend
