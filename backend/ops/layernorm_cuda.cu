// CUDA twin of layernorm.hpp (CPU twin: layernorm_cpu.cpp; the layout of llm.c's
// layernorm_forward/backward and Megatron's FusedLayerNorm):
//   mean = Σ x / C,  rstd = 1 / sqrt(Σ (x − mean)² / C + ε),  x̂ = (x − mean) · rstd
//   y = x̂ · w + b
//   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂,   db += Σ_rows dy
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics: the kernels are norm_rows_cuda.cuh's, shared with
// rmsnorm_cuda.cu (one block per row with block_sum's fixed tree for the row sums; dw and db as
// per-row-group partials in row order into `scratch`, added in group order by a second kernel).
#include "backend/ops/layernorm.hpp"
#include "backend/ops/norm_rows_cuda.cuh"

namespace backend::cuda {

int64_t layernorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return detail::column_sums_scratch_floats(2, rows, channels);
}

template <typename Scalar>
void layernorm_forward(Scalar* output, float* mean, float* rstd, const Scalar* input,
                       const Scalar* weight, const Scalar* bias, float weight_offset, float epsilon,
                       int64_t rows, int64_t channels, CudaStream stream,
                       ResidualAdd<Scalar> residual) {
  detail::launch_norm_forward<NormKind::layer_norm>(
      detail::device_pointer(output), mean, rstd, detail::device_pointer(input),
      detail::device_pointer(weight), detail::device_pointer(bias), weight_offset, epsilon, rows,
      channels, stream, detail::device_residual(residual));
}

template <typename Scalar>
void layernorm_backward(Scalar* dinput, float* dweight, float* dbias, const Scalar* doutput,
                        const Scalar* input, const Scalar* weight, float weight_offset,
                        const float* mean, const float* rstd, int64_t rows, int64_t channels,
                        float* scratch, CudaStream stream, InputGradient mode) {
  detail::launch_norm_backward<NormKind::layer_norm>(
      detail::device_pointer(dinput), dweight, dbias, detail::device_pointer(doutput),
      detail::device_pointer(input), detail::device_pointer(weight), weight_offset, mean, rstd,
      rows, channels, scratch, stream, mode);
}

#define BACKEND_INSTANTIATE_LAYERNORM_CUDA(Scalar)                                                \
  template void layernorm_forward<Scalar>(Scalar*, float*, float*, const Scalar*, const Scalar*,  \
                                          const Scalar*, float, float, int64_t, int64_t,          \
                                          CudaStream, ResidualAdd<Scalar>);                       \
  template void layernorm_backward<Scalar>(Scalar*, float*, float*, const Scalar*, const Scalar*, \
                                           const Scalar*, float, const float*, const float*,      \
                                           int64_t, int64_t, float*, CudaStream, InputGradient);
BACKEND_INSTANTIATE_LAYERNORM_CUDA(float)
BACKEND_INSTANTIATE_LAYERNORM_CUDA(bfloat16)
BACKEND_INSTANTIATE_LAYERNORM_CUDA(float16)
#undef BACKEND_INSTANTIATE_LAYERNORM_CUDA

}  // namespace backend::cuda
