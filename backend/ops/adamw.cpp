// adamw.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/adamw.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void adamw_update(Device& device, View master, View weights, View gradients, View exp_avg,
                  View exp_avg_sq, View coefficients, View control,
                  std::span<const AdamWGroup> groups) {
  constexpr const char* op = "adamw_update";
  if (!weights.empty() && device.memory_kind() == MemoryKind::host) {
    common::fail("adamw_update: the CPU device keeps fp32 weights, which are the master weights; "
                 "a separate {} working copy is the CUDA device's mixed precision",
                 element_name(weights.type));
  }
  const int64_t count = master.numel;
  for (const View* view : {&gradients, &exp_avg, &exp_avg_sq}) {
    if (view->numel != count) {
      common::fail("adamw_update: {} master weights but a view of {} elements", count,
                   view->numel);
    }
  }
  if (!weights.empty() && weights.numel != count) {
    common::fail("adamw_update: {} master weights but {} working weights", count, weights.numel);
  }
  if (coefficients.type != ElementType::f32 || coefficients.numel != kAdamWCoefficientFloats) {
    common::fail("adamw_update: the coefficients must be an AdamWCoefficients ({} fp32), got {} {}",
                 kAdamWCoefficientFloats, coefficients.numel, element_name(coefficients.type));
  }
  if (!control.empty() && (control.type != ElementType::f64 || control.numel != 2)) {
    common::fail("adamw_update: the control (ops::decide_step's) must be 2 f64, got {} {}",
                 control.numel, element_name(control.type));
  }
  int64_t previous_end = 0;
  for (const AdamWGroup& group : groups) {
    if (group.offset < previous_end || group.numel < 0 || group.numel > count - group.offset) {
      common::fail(
          "adamw_update: the group [{}, {}) is out of order, overlaps the one before or "
          "lies outside the {} elements",
          group.offset, group.offset + group.numel, count);
    }
    previous_end = group.offset + group.numel;
  }
  run(
      device, op, 0,
      [=] {
        cpu::adamw_update(host<float>(master), host<float>(gradients), host<float>(exp_avg),
                          host<float>(exp_avg_sq), count,
                          reinterpret_cast<const AdamWCoefficients*>(host<float>(coefficients)),
                          control.empty() ? nullptr : host<double>(control), groups);
      },
      [&](const auto& context) {
        float* master_data = gpu<float>(master, op);
        const float* gradient_data = gpu<float>(gradients, op);
        float* m = gpu<float>(exp_avg, op);
        float* v = gpu<float>(exp_avg_sq, op);
        const double* decision = gpu<double>(control, op);
        const auto* c = reinterpret_cast<const AdamWCoefficients*>(gpu<float>(coefficients, op));
        if (weights.empty()) {
          cuda::adamw_update<float>(master_data, nullptr, gradient_data, m, v, count, c, decision,
                                    groups, context.stream);
        } else if (weights.type == ElementType::f16) {
          cuda::adamw_update(master_data, gpu<float16>(weights, op), gradient_data, m, v, count, c,
                             decision, groups, context.stream);
        } else {
          cuda::adamw_update(master_data, gpu<bfloat16>(weights, op), gradient_data, m, v, count, c,
                             decision, groups, context.stream);
        }
      });
}

}  // namespace backend::ops
