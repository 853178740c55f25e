// CPU twin of adamw.hpp.
#include <cmath>

#include "backend/ops/adamw.hpp"

namespace backend::cpu {

void adamw_update(float* master, const float* gradients, float* exp_avg, float* exp_avg_sq,
                  int64_t count, const AdamWCoefficients& c) {
  float* p = master;
  const float* g = gradients;
  float* m = exp_avg;
  float* v = exp_avg_sq;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float gradient = g[i] * c.gradient_scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gradient;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gradient * gradient;
    const float denominator = std::sqrt(v[i]) * c.inverse_sqrt_correction2 + c.eps;
    p[i] -= c.step_size * m[i] / denominator + c.decay * p[i];
  }
}

}  // namespace backend::cpu
