// Megatron's OptimizerParamScheduler.get_lr and get_wd; see lr_scheduler.hpp.
#include "backend/optim/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/common/error.hpp"

namespace backend {

LearningRateScheduler::LearningRateScheduler(const LearningRateSchedule& schedule)
    : schedule_(schedule) {
  const auto& s = schedule;
  // Megatron's asserts in OptimizerParamScheduler.__init__, as errors that say what is wrong.
  if (!(s.min_lr >= 0 && s.max_lr >= s.min_lr)) {
    common::fail("learning-rate schedule: need 0 ≤ --min-lr ({}) ≤ --lr ({})", s.min_lr, s.max_lr);
  }
  if (s.init_lr > s.max_lr) {
    common::fail("learning-rate schedule: --lr-warmup-init {} exceeds --lr {}", s.init_lr, s.max_lr);
  }
  if (s.decay_steps <= 0) {
    common::fail("learning-rate schedule: the decay must last at least one sample, got {}",
                 s.decay_steps);
  }
  if (!(s.warmup_steps >= 0 && s.warmup_steps < static_cast<double>(s.decay_steps))) {
    common::fail("learning-rate schedule: the warmup ({} samples) must be shorter than the decay "
                 "({} samples)", s.warmup_steps, s.decay_steps);
  }
  if (s.decay_style == LearningRateDecayStyle::wsd && s.wsd_decay_steps < 0) {
    common::fail("--lr-decay-style WSD needs the length of its final decay: --lr-wsd-decay-iters "
                 "(or --lr-wsd-decay-samples with --train-samples)");
  }
  if (!(s.start_weight_decay >= 0 && s.end_weight_decay >= s.start_weight_decay)) {
    common::fail("weight-decay schedule: need 0 ≤ --start-weight-decay ({}) ≤ --end-weight-decay ({})",
                 s.start_weight_decay, s.end_weight_decay);
  }
  if (s.weight_decay_increment_style == WeightDecayIncrementStyle::constant &&
      s.start_weight_decay != s.end_weight_decay) {
    common::fail("--weight-decay-incr-style constant needs --start-weight-decay ({}) equal to "
                 "--end-weight-decay ({})", s.start_weight_decay, s.end_weight_decay);
  }
  if (s.weight_decay_increment_steps <= 0) {
    common::fail("weight-decay schedule: the increment must last at least one sample, got {}",
                 s.weight_decay_increment_steps);
  }
}

double LearningRateScheduler::learning_rate() const {
  const auto& s = schedule_;
  const double steps = static_cast<double>(num_steps_);
  if (s.warmup_steps > 0 && steps <= s.warmup_steps) {
    return s.init_lr + (s.max_lr - s.init_lr) * steps / s.warmup_steps;
  }
  if (s.decay_style == LearningRateDecayStyle::constant) return s.max_lr;
  if (num_steps_ > s.decay_steps) return s.min_lr;
  if (s.decay_style == LearningRateDecayStyle::inverse_square_root) {
    const double warmup = std::max(s.warmup_steps, 1.0);
    const double current = std::max(steps, 1.0);
    return std::max(s.min_lr, s.max_lr * std::sqrt(warmup) / std::sqrt(current));
  }
  const double decay_ratio =
      (steps - s.warmup_steps) / (static_cast<double>(s.decay_steps) - s.warmup_steps);
  double coefficient = 0;
  if (s.decay_style == LearningRateDecayStyle::linear) {
    coefficient = 1.0 - decay_ratio;
  } else if (s.decay_style == LearningRateDecayStyle::cosine) {
    coefficient = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  } else {  // WSD: stable until the anneal starts; wsd_decay_steps 0 never anneals
    const int64_t anneal_start = s.decay_steps - s.wsd_decay_steps;
    if (num_steps_ <= anneal_start) {
      coefficient = 1.0;
    } else {
      const double w = static_cast<double>(num_steps_ - anneal_start) /
                       static_cast<double>(s.wsd_decay_steps);
      switch (s.wsd_decay_style) {
        case WsdDecayStyle::linear:
          coefficient = 1.0 - w;
          break;
        case WsdDecayStyle::cosine:
          coefficient = 0.5 * (std::cos(std::numbers::pi * w) + 1.0);
          break;
        case WsdDecayStyle::exponential:
          coefficient = 2.0 * std::pow(0.5, w) - 1.0;
          break;
        case WsdDecayStyle::minus_sqrt:
          coefficient = 1.0 - std::sqrt(w);
          break;
      }
    }
  }
  return s.min_lr + coefficient * (s.max_lr - s.min_lr);
}

double LearningRateScheduler::weight_decay() const {
  const auto& s = schedule_;
  if (num_steps_ > s.weight_decay_increment_steps ||
      s.weight_decay_increment_style == WeightDecayIncrementStyle::constant) {
    return s.end_weight_decay;
  }
  const double ratio = static_cast<double>(num_steps_) /
                       static_cast<double>(s.weight_decay_increment_steps);
  const double coefficient = s.weight_decay_increment_style == WeightDecayIncrementStyle::linear
                                 ? ratio
                                 : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
  return s.start_weight_decay + coefficient * (s.end_weight_decay - s.start_weight_decay);
}

void LearningRateScheduler::step(int64_t increment) { num_steps_ += increment; }

void LearningRateScheduler::set_num_steps(int64_t num_steps) {
  if (num_steps < 0) common::fail("learning-rate scheduler: num_steps must be ≥ 0, got {}", num_steps);
  num_steps_ = num_steps;
}

}  // namespace backend
