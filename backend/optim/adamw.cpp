// AdamW and global-norm clipping over flat buffers on a Device; see adamw.hpp.
#include "backend/ops/adamw.hpp"
#include "backend/optim/adamw.hpp"

#include <cmath>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/ops/reduction.hpp"

namespace backend {

namespace {

std::vector<AdamWGroup> merge_adjacent(const std::vector<ParameterGroup>& groups, int64_t numel) {
  std::vector<AdamWGroup> merged;
  for (const auto& group : groups) {
    if (group.offset < 0 || group.numel < 0 || group.offset > numel ||
        group.numel > numel - group.offset) {
      common::fail("AdamW: parameter group [{}, {}) lies outside the {} parameters", group.offset,
                   group.offset + group.numel, numel);
    }
    if (group.numel == 0) continue;
    if (!merged.empty() && merged.back().decayed == group.weight_decay &&
        merged.back().offset + merged.back().numel == group.offset) {
      merged.back().numel += group.numel;
    } else {
      merged.push_back({group.offset, group.numel, group.weight_decay});
    }
  }
  return merged;
}

}  // namespace

AdamW::AdamW(const AdamWConfig& config, std::vector<ParameterGroup> groups, int64_t numel,
             Device& device)
    : config_(config), groups_(merge_adjacent(groups, numel)), numel_(numel), device_(&device) {
  carve_state();
}

AdamW::AdamW(const AdamWConfig& config, std::vector<ParameterGroup> groups, int64_t numel)
    : config_(config),
      groups_(merge_adjacent(groups, numel)),
      numel_(numel),
      owned_device_(std::make_unique<CpuDevice>()),
      device_(owned_device_.get()) {
  carve_state();
}

void AdamW::carve_state() {
  if (numel_ < 0) common::fail("AdamW: the parameter count must be ≥ 0, got {}", numel_);
  ArenaLayout layout;
  const int64_t exp_avg_region = layout.add("optimizer.exp_avg", ElementType::f32, numel_);
  const int64_t exp_avg_sq_region = layout.add("optimizer.exp_avg_sq", ElementType::f32, numel_);
  const int64_t norm_region = layout.add("the gradient norm's total", ElementType::f64, 1);
  const int64_t step_region = layout.add("the step's scalars", ElementType::f64, 7);
  const int64_t coefficients_region =
      layout.add("AdamW's step coefficients", ElementType::f32, kAdamWCoefficientFloats);
  state_ = Arena(*device_, std::move(layout), "optimizer state");
  exp_avg_ = state_.view(exp_avg_region);
  exp_avg_sq_ = state_.view(exp_avg_sq_region);
  norm_total_ = state_.view(norm_region);
  coefficients_ = state_.view(coefficients_region);
  // Two slots: a step's coefficients are staged while the device may still be copying the
  // previous step's.
  coefficient_uploads_ = PinnedUploadRing(*device_, 2, int64_t{sizeof(AdamWCoefficients)},
                                          "AdamW's step coefficients");
  const View step = state_.view(step_region);
  step_scalars_ = {.loss_total = step.slice(0, 1),
                   .sum_of_squares = step.slice(1, 1),
                   .logged_total = step.slice(2, 1),
                   .partial = step.slice(3, 1),
                   .control = step.slice(4, 2),
                   .zeros_in_grad = step.slice(6, 1),
                   .all = step};
  step_scalars_host_ = device_->allocate_pinned_host(step.bytes(), "the step's scalars, read back");
  step_scalars_.host = static_cast<double*>(step_scalars_host_.data());
}

AdamW::~AdamW() = default;
AdamW::AdamW(AdamW&&) noexcept = default;
AdamW& AdamW::operator=(AdamW&&) noexcept = default;

void AdamW::check_step(View master, View gradients, View control, double gradient_scale) const {
  if (!control.empty() && gradient_scale != 1.0) {
    common::fail(
        "AdamW::step: a device decision (control) gives the gradient scale; {} was "
        "given as well",
        gradient_scale);
  }
  if (master.numel != numel_ || gradients.numel != numel_) {
    common::fail("AdamW: {} parameters, but {} master weights and {} gradients were given",
                 numel_, master.numel, gradients.numel);
  }
}

void AdamW::stage_step(double lr, double weight_decay, double gradient_scale) {
  ++step_;
  const double bias_correction1 = 1.0 - std::pow(config_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(config_.beta2, static_cast<double>(step_));
  AdamWCoefficients coefficients{
      .beta1 = static_cast<float>(config_.beta1),
      .beta2 = static_cast<float>(config_.beta2),
      .eps = static_cast<float>(config_.eps),
      .step_size = static_cast<float>(lr / bias_correction1),
      .inverse_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2)),
      .decay = static_cast<float>(lr * weight_decay),  // where a group is decayed
      // As ops::scale rounds its factor (reduction.hpp), so the products are its bits.
      .gradient_scale = static_cast<float>(gradient_scale)};
  coefficient_uploads_.upload(coefficients_, &coefficients);
  staged_ = true;
  staged_gradient_scale_ = gradient_scale;
}

void AdamW::queue_step(View master, View weights, View gradients, View control) {
  if (!staged_) {
    common::fail("AdamW::queue_step: no step's coefficients were staged (stage_step first)");
  }
  check_step(master, gradients, control, staged_gradient_scale_);
  staged_ = false;
  // One multi-tensor update of every group (no group: nothing to update).
  if (groups_.empty()) return;
  ops::adamw_update(*device_, master, weights, gradients, exp_avg_, exp_avg_sq_, coefficients_,
                    control, groups_);
}

void AdamW::step(View master, View weights, View gradients, double lr, double weight_decay,
                 double gradient_scale, View control) {
  // Checked before the step is counted, so a refused call changes nothing.
  check_step(master, gradients, control, gradient_scale);
  stage_step(lr, weight_decay, gradient_scale);
  queue_step(master, weights, gradients, control);
}

void AdamW::step_skipped() {
  if (step_ == 0) common::fail("AdamW::step_skipped: no step was taken");
  --step_;
}

void AdamW::step(std::span<float> parameters, std::span<const float> gradients, double lr) {
  step(parameters, gradients, lr, config_.weight_decay);
}

void AdamW::step(std::span<float> parameters, std::span<const float> gradients, double lr,
                 double weight_decay) {
  step(host_view(parameters), View{}, host_view(gradients), lr, weight_decay);
}

double AdamW::gradient_norm(View gradients) { return std::sqrt(sum_of_squares(gradients)); }

double AdamW::sum_of_squares(View values) {
  ops::sum_of_squares(*device_, norm_total_, values);
  double total = 0;
  device_->copy_to_host(&total, norm_total_);
  return total;
}

void AdamW::clip_gradients(View gradients, double norm, double max_norm) {
  if (const auto coefficient = clip_coefficient(norm, max_norm)) {
    ops::scale(*device_, gradients, *coefficient);
  }
}

namespace {

std::span<float> host_moments(View moments, const Device& device) {
  if (moments.on != MemoryKind::host) {
    common::fail("AdamW: the moments live on {}, not in host memory; copy them with "
                 "copy_moments_to_host",
                 device.name());
  }
  return {moments.as<float>(), static_cast<size_t>(moments.numel)};
}

void check_moment_size(size_t size, int64_t numel, const char* what) {
  if (static_cast<int64_t>(size) != numel) {
    common::fail("AdamW::{}: {} values for {} parameters", what, size, numel);
  }
}

}  // namespace

std::span<float> AdamW::exp_avg() { return host_moments(exp_avg_, *device_); }
std::span<const float> AdamW::exp_avg() const { return host_moments(exp_avg_, *device_); }
std::span<float> AdamW::exp_avg_sq() { return host_moments(exp_avg_sq_, *device_); }
std::span<const float> AdamW::exp_avg_sq() const { return host_moments(exp_avg_sq_, *device_); }

void AdamW::copy_moments_to_host(std::span<float> exp_avg, std::span<float> exp_avg_sq) const {
  check_moment_size(exp_avg.size(), numel_, "copy_moments_to_host");
  check_moment_size(exp_avg_sq.size(), numel_, "copy_moments_to_host");
  device_->copy_to_host(exp_avg.data(), exp_avg_);
  device_->copy_to_host(exp_avg_sq.data(), exp_avg_sq_);
}

void AdamW::copy_moments_from_host(std::span<const float> exp_avg,
                                   std::span<const float> exp_avg_sq) {
  check_moment_size(exp_avg.size(), numel_, "copy_moments_from_host");
  check_moment_size(exp_avg_sq.size(), numel_, "copy_moments_from_host");
  device_->copy_from_host(exp_avg_, exp_avg.data());
  device_->copy_from_host(exp_avg_sq_, exp_avg_sq.data());
}

void AdamW::set_steps_taken(int64_t steps) {
  if (steps < 0) common::fail("AdamW: the step count must be ≥ 0, got {}", steps);
  step_ = steps;
}

std::optional<double> clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return std::nullopt;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0) return std::nullopt;
  return coefficient;
}

double global_gradient_norm(std::span<const float> gradients) {
  double total = 0;
  cpu::sum_of_squares(&total, gradients.data(), static_cast<int64_t>(gradients.size()));
  return std::sqrt(total);
}

void clip_gradients(std::span<float> gradients, double norm, double max_norm) {
  if (const auto coefficient = clip_coefficient(norm, max_norm)) {
    cpu::scale(gradients.data(), *coefficient, static_cast<int64_t>(gradients.size()));
  }
}

}  // namespace backend
