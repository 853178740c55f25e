// CUDA twin of adamw.hpp (CPU twin: adamw_cpu.cpp): one thread per element in a grid-stride
// loop, the same float expressions in the same order as the CPU twin (nvcc may contract a
// multiply-add into an fma where the CPU build does not, so the bits can differ in the last
// place; the tests compare by normalised error). With a bf16 working copy the rounded master
// is written in the same pass, so the forward never reads a stale copy and no second kernel
// reads the master again (llm.c's adamw_kernel3 does the same).
#include "backend/ops/adamw.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

template <typename Weight>
__global__ void adamw_kernel(float* master, Weight* weights, const float* gradients,
                             float* exp_avg, float* exp_avg_sq, int64_t count,
                             AdamWCoefficients c) {
  for (const int64_t i : detail::grid_stride(count)) {
    const float g = gradients[i] * c.gradient_scale;
    const float m = c.beta1 * exp_avg[i] + (1.0f - c.beta1) * g;
    const float v = c.beta2 * exp_avg_sq[i] + (1.0f - c.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denominator = sqrtf(v) * c.inverse_sqrt_correction2 + c.eps;
    const float p = master[i];
    const float updated = p - (c.step_size * m / denominator + c.decay * p);
    master[i] = updated;
    if (weights != nullptr) weights[i] = detail::from_float<Weight>(updated);
  }
}

}  // namespace

template <typename Weight>
void adamw_update(float* master, Weight* weights, const float* gradients, float* exp_avg,
                  float* exp_avg_sq, int64_t count, const AdamWCoefficients& coefficients,
                  CudaStream stream) {
  if (count <= 0) return;
  adamw_kernel<<<detail::grid_for(count), detail::kBlockSize, 0, stream>>>(
      master, detail::device_pointer(weights), gradients, exp_avg, exp_avg_sq, count,
      coefficients);
  CUDA_CHECK(cudaGetLastError());
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, int64_t,
                                  const AdamWCoefficients&, CudaStream);
template void adamw_update<bfloat16>(float*, bfloat16*, const float*, float*, float*, int64_t,
                                     const AdamWCoefficients&, CudaStream);
template void adamw_update<float16>(float*, float16*, const float*, float*, float*, int64_t,
                                    const AdamWCoefficients&, CudaStream);

}  // namespace backend::cuda
