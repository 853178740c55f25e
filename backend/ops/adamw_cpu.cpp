// CPU twin of adamw.hpp.
#include <cmath>

#include "backend/ops/adamw.hpp"

namespace backend::cpu {

namespace {

void update_range(float* p, const float* g, float* m, float* v, int64_t count,
                  const AdamWCoefficients& c, float gradient_scale, float decay) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float gradient = g[i] * gradient_scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gradient;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gradient * gradient;
    const float denominator = std::sqrt(v[i]) * c.inverse_sqrt_correction2 + c.eps;
    p[i] -= c.step_size * m[i] / denominator + decay * p[i];
  }
}

}  // namespace

void adamw_update(float* master, const float* gradients, float* exp_avg, float* exp_avg_sq,
                  int64_t count, const AdamWCoefficients* coefficients, const double* control,
                  std::span<const AdamWGroup> groups) {
  if (control != nullptr && control[1] != 0.0) return;
  const AdamWCoefficients c = *coefficients;
  const float gradient_scale =
      control != nullptr ? static_cast<float>(control[0]) : c.gradient_scale;
  if (groups.empty()) {
    update_range(master, gradients, exp_avg, exp_avg_sq, count, c, gradient_scale, c.decay);
    return;
  }
  for (const AdamWGroup& group : groups) {
    const int64_t at = group.offset;
    update_range(master + at, gradients + at, exp_avg + at, exp_avg_sq + at, group.numel, c,
                 gradient_scale, group.decayed ? c.decay : 0.0f);
  }
}

}  // namespace backend::cpu
