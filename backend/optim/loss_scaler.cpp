// Megatron-LM's constant and dynamic grad scalers; see loss_scaler.hpp.
// Reference: megatron/core/optimizer/grad_scaler.py (semantics only).
#include "backend/optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/common/error.hpp"

namespace backend {

namespace {

constexpr double kLargestFloat32 = std::numeric_limits<float>::max();

// Megatron keeps the scale in a float32 tensor: a value is what float32 makes of it.
double as_float32(double value) {
  return static_cast<double>(static_cast<float>(value));
}

// A scale that float32 holds as a finite positive number, as float32 holds it. `what` names the
// value for the message ("--loss-scale", "the saved loss scale").
double checked_scale(double value, const char* what) {
  if (!std::isfinite(value) || value <= 0) {
    common::fail("{} {} must be a finite number > 0", what, value);
  }
  if (value > kLargestFloat32) {
    common::fail(
        "{} {} exceeds {:g}, the largest float32: the loss scale is a float32 value, as "
        "in Megatron",
        what, value, kLargestFloat32);
  }
  const double rounded = as_float32(value);
  if (rounded == 0) {
    common::fail(
        "{} {} is below the smallest positive float32: the loss scale is a float32 "
        "value, as in Megatron",
        what, value);
  }
  return rounded;
}

}  // namespace

LossScaler LossScaler::none() {
  return {Kind::none, 1.0};
}

LossScaler LossScaler::constant(double scale) {
  return {Kind::constant, checked_scale(scale, "--loss-scale")};
}

LossScaler LossScaler::dynamic(const DynamicLossScaling& config) {
  // Megatron's DynamicGradScaler asserts, with the flags that set each value named.
  const double initial = checked_scale(config.initial_scale, "--initial-loss-scale");
  const double min = checked_scale(config.min_scale, "--min-loss-scale");
  if (config.min_scale > config.initial_scale) {
    common::fail(
        "--min-loss-scale {} exceeds --initial-loss-scale {}: dynamic loss scaling (--fp16 "
        "without --loss-scale) starts at the initial scale and never goes below the "
        "minimum; lower --min-loss-scale or raise --initial-loss-scale",
        config.min_scale, config.initial_scale);
  }
  // Megatron's factors are float32 tensors too (its 2 and 0.5 are exact either way): checked as
  // float32 holds them, so a factor that rounds to 1 is refused.
  const double growth = as_float32(config.growth_factor),
               backoff = as_float32(config.backoff_factor);
  if (!std::isfinite(growth) || growth <= 1) {
    common::fail("loss scaler: the growth factor {} must be finite and > 1", config.growth_factor);
  }
  if (!(backoff > 0 && backoff < 1)) {
    common::fail("loss scaler: the backoff factor {} must lie in (0, 1)", config.backoff_factor);
  }
  if (config.growth_interval < 1) {
    common::fail("--loss-scale-window {} must be ≥ 1", config.growth_interval);
  }
  if (config.hysteresis < 1) common::fail("--hysteresis {} must be ≥ 1", config.hysteresis);
  LossScaler scaler(Kind::dynamic, initial);
  scaler.config_ = config;
  scaler.config_.initial_scale = initial;
  scaler.config_.min_scale = min;
  scaler.config_.growth_factor = growth;
  scaler.config_.backoff_factor = backoff;
  scaler.growth_tracker_ = 0;
  scaler.hysteresis_tracker_ = config.hysteresis;
  return scaler;
}

double LossScaler::inverse_scale() const {
  // Of a subnormal scale, 1/scale exceeds float32's range: inf, as Megatron's float() gives (a
  // conversion out of range would be undefined in C++).
  const double inverse = 1.0 / scale_;
  return inverse > kLargestFloat32 ? std::numeric_limits<double>::infinity() : as_float32(inverse);
}

void LossScaler::update(bool found_inf) {
  if (kind_ != Kind::dynamic) return;
  if (found_inf) {
    growth_tracker_ = 0;
    // Below 0 over a run of overflows, as Megatron's (a checkpoint keeps the same number); the
    // guard only keeps a restored extreme value from wrapping.
    if (hysteresis_tracker_ > std::numeric_limits<int64_t>::min()) --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) {
      scale_ = std::max(as_float32(scale_ * config_.backoff_factor), config_.min_scale);
    }
    return;
  }
  // A restored tracker may already be at or past a shorter window: it grows now (see the header).
  if (growth_tracker_ < config_.growth_interval) ++growth_tracker_;
  if (growth_tracker_ >= config_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = config_.hysteresis;
    const double grown = scale_ * config_.growth_factor;
    if (grown <= kLargestFloat32) scale_ = as_float32(grown);
  }
}

LossScaler::State LossScaler::state() const {
  return {.scale = scale_,
          .growth_tracker = growth_tracker_,
          .hysteresis_tracker = hysteresis_tracker_};
}

void LossScaler::restore(const State& state) {
  if (kind_ != Kind::dynamic) return;
  const double scale = checked_scale(state.scale, "the saved loss scale");
  if (state.growth_tracker < 0) {
    common::fail("the saved loss scaler's growth tracker {} must be ≥ 0", state.growth_tracker);
  }
  scale_ = scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
}

}  // namespace backend
