// CUDA twin of rmsnorm.hpp (CPU twin: rmsnorm_cpu.cpp; Megatron's RMSNorm):
//   rstd = 1 / sqrt(Σ x² / C + ε),  x̂ = x · rstd,  y = x̂ · w
//   dx = rstd · (g − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics, as layernorm_cuda.cu, with the same kernels
// (norm_rows_cuda.cuh: one block per row with block_sum's fixed tree; dw as per-row-group
// partials in row order into `scratch`, added in group order by a second kernel).
#include "backend/ops/norm_rows_cuda.cuh"
#include "backend/ops/rmsnorm.hpp"

namespace backend::cuda {

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return detail::column_sums_scratch_floats(1, rows, channels);
}

template <typename Scalar>
void rmsnorm_forward(Scalar* output, float* rstd, const Scalar* input, const Scalar* weight,
                     float epsilon, int64_t rows, int64_t channels, CudaStream stream,
                     ResidualAdd<Scalar> residual) {
  using T = detail::DeviceElementOf<Scalar>;
  detail::launch_norm_forward<NormKind::rms_norm>(
      detail::device_pointer(output), nullptr, rstd, detail::device_pointer(input),
      detail::device_pointer(weight), static_cast<const T*>(nullptr), 0.0f, epsilon, rows, channels,
      stream, detail::device_residual(residual));
}

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput, float* dweight, const Scalar* doutput, const Scalar* input,
                      const Scalar* weight, const float* rstd, int64_t rows, int64_t channels,
                      float* scratch, CudaStream stream, InputGradient mode) {
  detail::launch_norm_backward<NormKind::rms_norm>(
      detail::device_pointer(dinput), dweight, nullptr, detail::device_pointer(doutput),
      detail::device_pointer(input), detail::device_pointer(weight), 0.0f, nullptr, rstd, rows,
      channels, scratch, stream, mode);
}

#define BACKEND_INSTANTIATE_RMSNORM_CUDA(Scalar)                                                \
  template void rmsnorm_forward<Scalar>(Scalar*, float*, const Scalar*, const Scalar*, float,   \
                                        int64_t, int64_t, CudaStream, ResidualAdd<Scalar>);     \
  template void rmsnorm_backward<Scalar>(Scalar*, float*, const Scalar*, const Scalar*,         \
                                         const Scalar*, const float*, int64_t, int64_t, float*, \
                                         CudaStream, InputGradient);
BACKEND_INSTANTIATE_RMSNORM_CUDA(float)
BACKEND_INSTANTIATE_RMSNORM_CUDA(bfloat16)
BACKEND_INSTANTIATE_RMSNORM_CUDA(float16)
#undef BACKEND_INSTANTIATE_RMSNORM_CUDA

}  // namespace backend::cuda
