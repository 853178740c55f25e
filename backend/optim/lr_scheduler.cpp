// Megatron's OptimizerParamScheduler.get_lr; see lr_scheduler.hpp.
#include "backend/optim/lr_scheduler.hpp"

#include <cmath>
#include <numbers>

#include "backend/common/error.hpp"

namespace backend {

LearningRateScheduler::LearningRateScheduler(const LearningRateSchedule& schedule)
    : schedule_(schedule) {
  if (schedule.decay_style != "constant" && schedule.decay_style != "linear" &&
      schedule.decay_style != "cosine") {
    common::fail("--lr-decay-style '{}' is not valid (valid: constant, linear, cosine)",
                 schedule.decay_style);
  }
}

double LearningRateScheduler::learning_rate() const {
  const auto& s = schedule_;
  if (s.warmup_steps > 0 && num_steps_ <= s.warmup_steps) {
    return s.init_lr + (s.max_lr - s.init_lr) * static_cast<double>(num_steps_) /
                           static_cast<double>(s.warmup_steps);
  }
  if (s.decay_style == "constant") return s.max_lr;
  if (num_steps_ > s.decay_steps) return s.min_lr;
  const double decay_ratio = static_cast<double>(num_steps_ - s.warmup_steps) /
                             static_cast<double>(s.decay_steps - s.warmup_steps);
  const double coefficient = s.decay_style == "linear"
                                 ? 1.0 - decay_ratio
                                 : 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  return s.min_lr + coefficient * (s.max_lr - s.min_lr);
}

void LearningRateScheduler::step(int64_t increment) { num_steps_ += increment; }

void LearningRateScheduler::set_num_steps(int64_t num_steps) {
  if (num_steps < 0) common::fail("learning-rate scheduler: num_steps must be ≥ 0, got {}", num_steps);
  num_steps_ = num_steps;
}

}  // namespace backend
