// Megatron-LM's learning-rate and weight-decay schedule (megatron/core/optimizer_param_scheduler.py,
// OptimizerParamScheduler.get_lr and get_wd), counted in samples as Megatron counts it.
// Learning rate at num_steps samples:
//   warmup  (warmup_steps > 0 and num_steps ≤ warmup_steps):
//                               lr = init + (max − init) · num_steps / warmup_steps
//   constant:                   lr = max
//   after decay_steps:          lr = min
//   inverse-square-root:        lr = max(min, max · sqrt(max(warmup, 1)) / sqrt(max(num_steps, 1)))
//   otherwise, r = (num_steps − warmup_steps) / (decay_steps − warmup_steps) and
//     linear   lr = min + (max − min) · (1 − r)
//     cosine   lr = min + (max − min) · 0.5 · (cos(π r) + 1)
//     WSD      (warmup-stable-decay) the rate stays at max until decay_steps − wsd_decay_steps,
//              then with w = (num_steps − (decay_steps − wsd_decay_steps)) / wsd_decay_steps:
//              lr = min + (max − min) · c(w), c by --lr-wsd-decay-style:
//              exponential 2 · 0.5^w − 1 | linear 1 − w | cosine 0.5 · (cos(π w) + 1) | minus_sqrt 1 − sqrt(w)
// Weight decay (get_wd) rises from start to end over weight_decay_increment_steps:
//   after the increment steps or when constant: end; otherwise with r = num_steps / incr_steps
//   linear start + (end − start) · r;  cosine start + (end − start) · 0.5 · (cos(π (1 − r)) + 1)
// Iteration-based runs count warmup, decay and WSD iterations × global batch size; sample-based
// runs take the sample counts as given (backend/train/training_schedule.hpp builds this).
// step(increment) is called after each successful optimizer step with that iteration's global
// batch size, so the rate logged on iteration N is the one iteration N+1 will use, as in Megatron.
// Megatron's asserts on the schedule become common::Error with the meaning spelled out.
#pragma once

#include <cstdint>
#include <span>

#include "backend/common/enum_names.hpp"

namespace backend {

// --lr-decay-style, --lr-wsd-decay-style and --weight-decay-incr-style, under Megatron's names
// (common/enum_names.hpp).
enum class LearningRateDecayStyle { constant, linear, cosine, inverse_square_root, wsd };
enum class WsdDecayStyle { exponential, linear, cosine, minus_sqrt };
enum class WeightDecayIncrementStyle { constant, linear, cosine };
constexpr common::EnumName<LearningRateDecayStyle> kLearningRateDecayStyleNames[] = {
    {LearningRateDecayStyle::constant, "constant"},
    {LearningRateDecayStyle::linear, "linear"},
    {LearningRateDecayStyle::cosine, "cosine"},
    {LearningRateDecayStyle::inverse_square_root, "inverse-square-root"},
    {LearningRateDecayStyle::wsd, "WSD"}};
constexpr common::EnumName<WsdDecayStyle> kWsdDecayStyleNames[] = {
    {WsdDecayStyle::exponential, "exponential"},
    {WsdDecayStyle::linear, "linear"},
    {WsdDecayStyle::cosine, "cosine"},
    {WsdDecayStyle::minus_sqrt, "minus_sqrt"}};
constexpr common::EnumName<WeightDecayIncrementStyle> kWeightDecayIncrementStyleNames[] = {
    {WeightDecayIncrementStyle::constant, "constant"},
    {WeightDecayIncrementStyle::linear, "linear"},
    {WeightDecayIncrementStyle::cosine, "cosine"}};
constexpr std::span<const common::EnumName<LearningRateDecayStyle>> enum_names(
    LearningRateDecayStyle) {
  return kLearningRateDecayStyleNames;
}
constexpr std::span<const common::EnumName<WsdDecayStyle>> enum_names(WsdDecayStyle) {
  return kWsdDecayStyleNames;
}
constexpr std::span<const common::EnumName<WeightDecayIncrementStyle>> enum_names(
    WeightDecayIncrementStyle) {
  return kWeightDecayIncrementStyleNames;
}

struct LearningRateSchedule {
  double max_lr = 0;
  double min_lr = 0;
  double init_lr = 0;        // --lr-warmup-init
  double warmup_steps = 0;   // samples; fractional with --lr-warmup-fraction, as in Megatron
  int64_t decay_steps = 0;   // samples
  LearningRateDecayStyle decay_style = LearningRateDecayStyle::linear;
  int64_t wsd_decay_steps = -1;  // WSD only: samples of the final anneal (−1: not given)
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::exponential;
  double start_weight_decay = 0;
  double end_weight_decay = 0;
  int64_t weight_decay_increment_steps = 1;  // samples (train iters × gbs, or train samples)
  WeightDecayIncrementStyle weight_decay_increment_style = WeightDecayIncrementStyle::constant;
};

class LearningRateScheduler {
 public:
  explicit LearningRateScheduler(const LearningRateSchedule& schedule);
  double learning_rate() const;  // for the current num_steps
  double weight_decay() const;   // for the current num_steps (decayed parameters only)
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
