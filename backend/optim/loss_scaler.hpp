// Megatron-LM's loss scaling for fp16 training (megatron/core/optimizer/grad_scaler.py:
// ConstantGradScaler, DynamicGradScaler): the loss is multiplied by `scale` before the backward
// pass so that small fp16 gradients do not flush to zero; the optimizer divides the gradients
// by it again, and when any of them is inf/nan (an overflow, "found_inf") it skips the update
// and tells the scaler, which adapts:
//   found_inf:  growth_tracker = 0; hysteresis_tracker -= 1;
//               if hysteresis_tracker ≤ 0: scale = max(scale · backoff_factor, min_scale)
//   otherwise:  growth_tracker += 1;
//               if growth_tracker reaches growth_interval: growth_tracker = 0,
//                 hysteresis_tracker = hysteresis, scale = scale · growth_factor
// So with hysteresis 2 the first overflow only spends a credit and the second halves the scale;
// once the credits are spent every further overflow halves it again, down to min_scale. The
// credits come back only when the scale grows, so the two overflows need not be consecutive
// (Megatron's docstring says "in a row"; its code, followed here, counts since the last growth).
// growth_interval clean steps in a row double the scale. A constant scaler never changes;
// "none" is Megatron's grad_scaler = None (bf16 without --loss-scale, and fp32): scale 1.0, no
// unscaling and no inf check.
// The scale is held as Megatron holds it, a float32 value: every scale this type reports is
// exactly representable in float32, so the loss is multiplied by the number Megatron's would be.
// Two differences, both outside what a run reaches from its flags: a growth that would overflow
// float32 keeps the scale (Megatron's would become inf and never come back), and the growth
// check is growth_tracker ≥ growth_interval, not ==, so a state restored into a run with a
// shorter --loss-scale-window still grows (with ==, Megatron's would never grow again).
// Which scaler a run gets from its flags: mixed_precision_arguments.hpp.
#pragma once

#include <cstdint>

namespace backend {

// DynamicGradScaler's constructor arguments. Megatron builds it with growth 2 and backoff 0.5;
// the others come from --initial-loss-scale, --min-loss-scale, --loss-scale-window and
// --hysteresis.
struct DynamicLossScaling {
  double initial_scale = 4294967296.0;  // 2^32
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
};

class LossScaler {
 public:
  enum class Kind { none, constant, dynamic };

  // What a checkpoint keeps (Megatron's DynamicGradScaler.state_dict: scale, growth_tracker,
  // hysteresis_tracker). The hysteresis tracker goes below 0 over a run of overflows and is
  // kept as it is: it returns to `hysteresis` only when the scale grows.
  struct State {
    double scale = 1.0;
    int64_t growth_tracker = 0;
    int64_t hysteresis_tracker = 0;
    bool operator==(const State&) const = default;
  };

  // Scale 1.0, never updated: no loss scaling (Megatron's grad_scaler = None).
  static LossScaler none();
  // ConstantGradScaler: `scale` (> 0 and finite) whatever the gradients do.
  static LossScaler constant(double scale);
  // DynamicGradScaler, with Megatron's asserts as common::Error: 0 < min_scale ≤
  // initial_scale, growth_factor > 1, 0 < backoff_factor < 1, growth_interval ≥ 1,
  // hysteresis ≥ 1, every real finite.
  static LossScaler dynamic(const DynamicLossScaling& config);

  Kind kind() const { return kind_; }
  // Whether Megatron would have a grad scaler: the step then unscales the gradients, checks
  // them for inf/nan and skips the update when it finds one (constant and dynamic alike).
  bool enabled() const { return kind_ != Kind::none; }
  bool dynamic() const { return kind_ == Kind::dynamic; }

  // The factor the loss is multiplied by now (after the last update()).
  double scale() const { return scale_; }
  // Megatron's inv_scale: 1/scale computed in double, then rounded to float32.
  double inverse_scale() const;

  // After each step's inf/nan check, as Megatron's optimizer calls it (before it decides to
  // skip). Only a dynamic scaler changes.
  void update(bool found_inf);

  // The trackers of a constant scaler or none are 0, as their state never changes.
  State state() const;
  // Continue from a checkpoint's state. A dynamic scaler takes it (scale rounded to float32;
  // a scale that is not finite and positive, or a negative growth tracker, is a common::Error
  // naming the bad value); a constant scaler and none keep what the flags gave, as Megatron's
  // ConstantGradScaler.load_state_dict and a missing grad scaler ignore the saved state.
  void restore(const State& state);

 private:
  LossScaler(Kind kind, double scale) : kind_(kind), scale_(scale) {}

  Kind kind_ = Kind::none;
  double scale_ = 1.0;
  DynamicLossScaling config_;  // dynamic only
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_ = 0;
};

}  // namespace backend
