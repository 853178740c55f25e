// CUDA twin of rmsnorm.hpp (CPU twin: rmsnorm_cpu.cpp; Megatron's RMSNorm):
//   rstd = 1 / sqrt(Σ x² / C + ε),  x̂ = x · rstd,  y = x̂ · w
//   dx = rstd · (g − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics, as layernorm_cuda.cu, with the same row walk and column sums
// (cuda_common.cuh): one block per row (16-byte packs along it where C and the pointers allow)
// with detail::block_sum's fixed tree, and dw as per-row-group partials in row order into
// `scratch`, added in group order by a second kernel (detail::launch_column_sums).
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/rmsnorm.hpp"

namespace backend::cuda {
namespace {

using detail::block_sum;
using detail::for_each_pack_of_row;
using detail::for_each_row;
using detail::load_floats;
using detail::store_floats;
using detail::to_float;

template <typename T, int Width>
__global__ void rmsnorm_forward_kernel(T* output, float* rstd, const T* input, const T* weight,
                                       float epsilon, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  for_each_row(rows, [&](int64_t row) {
    const T* x = input + row * channels;
    T* y = output + row * channels;
    float squares = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      load_floats(xs, x + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) squares += xs[j] * xs[j];
    });
    // 1 / sqrtf, not rsqrtf (an approximation): the CPU's correctly rounded quotient.
    const float row_rstd =
        1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(channels) + epsilon);
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(ws, weight + c);
      float ys[Width];
#pragma unroll
      for (int j = 0; j < Width; ++j) ys[j] = xs[j] * row_rstd * ws[j];
      store_floats(y + c, ys);
    });
    if (threadIdx.x == 0) rstd[row] = row_rstd;
  });
}

// dinput, one block per row, Width as the forward; reads at a channel precede its write and
// the sum completes before any write, so dinput may alias doutput.
template <typename T, int Width>
__global__ void rmsnorm_dinput_kernel(T* dinput, const T* doutput, const T* input, const T* weight,
                                      const float* rstd, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  const float inverse_channels = 1.0f / static_cast<float>(channels);
  for_each_row(rows, [&](int64_t row) {
    const T* x = input + row * channels;
    const T* dy = doutput + row * channels;
    T* dx = dinput + row * channels;
    const float row_rstd = rstd[row];
    float sum_g_xhat = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float dys[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(dys, dy + c);
      load_floats(ws, weight + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) sum_g_xhat += dys[j] * ws[j] * xs[j] * row_rstd;
    });
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) * inverse_channels;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float dys[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(dys, dy + c);
      load_floats(ws, weight + c);
      float dxs[Width];
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        dxs[j] = row_rstd * (dys[j] * ws[j] - xs[j] * row_rstd * mean_g_xhat);
      }
      store_floats(dx + c, dxs);
    });
  });
}

// dweight's column terms: dy · x̂.
template <typename T>
struct RmsnormWeightTerms {
  static constexpr int kSums = 1;
  const T* doutput;
  const T* input;
  const float* rstd;
  int64_t channels;
  __device__ void add(int64_t row, int64_t c, float (&sums)[kSums]) const {
    sums[0] +=
        to_float(doutput[row * channels + c]) * to_float(input[row * channels + c]) * rstd[row];
  }
};

}  // namespace

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return detail::column_sums_scratch_floats(1, rows, channels);
}

template <typename Scalar>
void rmsnorm_forward(Scalar* output, float* rstd, const Scalar* input, const Scalar* weight,
                     float epsilon, int64_t rows, int64_t channels, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* y = detail::device_pointer(output);
  const T* x = detail::device_pointer(input);
  const T* w = detail::device_pointer(weight);
  detail::launch_row_kernel<T>(channels, {y, x, w}, [&](auto width) {
    rmsnorm_forward_kernel<T, decltype(width)::value>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(y, rstd, x, w, epsilon, rows,
                                                                    channels);
  });
}

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput, float* dweight, const Scalar* doutput, const Scalar* input,
                      const Scalar* weight, const float* rstd, int64_t rows, int64_t channels,
                      float* scratch, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  const T* dy = detail::device_pointer(doutput);
  const T* x = detail::device_pointer(input);
  // The parameter sum first: it reads doutput, which dinput may overwrite.
  detail::launch_column_sums(detail::ColumnTargets<1>{{dweight}},
                             RmsnormWeightTerms<T>{dy, x, rstd, channels}, scratch, rows,
                             channels, stream);
  T* dx = detail::device_pointer(dinput);
  const T* w = detail::device_pointer(weight);
  detail::launch_row_kernel<T>(channels, {dx, dy, x, w}, [&](auto width) {
    rmsnorm_dinput_kernel<T, decltype(width)::value>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(dx, dy, x, w, rstd, rows,
                                                                    channels);
  });
}

#define BACKEND_INSTANTIATE_RMSNORM_CUDA(Scalar)                                                \
  template void rmsnorm_forward<Scalar>(Scalar*, float*, const Scalar*, const Scalar*, float,   \
                                        int64_t, int64_t, CudaStream);                          \
  template void rmsnorm_backward<Scalar>(Scalar*, float*, const Scalar*, const Scalar*,         \
                                         const Scalar*, const float*, int64_t, int64_t, float*, \
                                         CudaStream);
BACKEND_INSTANTIATE_RMSNORM_CUDA(float)
BACKEND_INSTANTIATE_RMSNORM_CUDA(bfloat16)
BACKEND_INSTANTIATE_RMSNORM_CUDA(float16)
#undef BACKEND_INSTANTIATE_RMSNORM_CUDA

}  // namespace backend::cuda
