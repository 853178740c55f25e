// CUDA twin of layernorm.hpp (CPU twin: layernorm_cpu.cpp; the layout of llm.c's
// layernorm_forward/backward and Megatron's FusedLayerNorm):
//   mean = Σ x / C,  rstd = 1 / sqrt(Σ (x − mean)² / C + ε),  x̂ = (x − mean) · rstd
//   y = x̂ · w + b
//   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂,   db += Σ_rows dy
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics: one block per row (16-byte packs along it where C and the
// pointers allow; cuda_common.cuh's row walk, shared with rmsnorm_cuda.cu) with
// detail::block_sum's fixed tree for the row sums (two passes, mean then squared deviations, as
// the CPU: E[x²] − E[x]² cancels in float); the column sums of dw and db are per-row-group
// partials in row order into `scratch`, then a second kernel adds the groups in order
// (detail::launch_column_sums).
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/layernorm.hpp"

namespace backend::cuda {
namespace {

using detail::block_sum;
using detail::for_each_pack_of_row;
using detail::for_each_row;
using detail::load_floats;
using detail::store_floats;
using detail::to_float;

template <typename T, int Width>
__global__ void layernorm_forward_kernel(T* output, float* mean, float* rstd, const T* input,
                                         const T* weight, const T* bias, float weight_offset,
                                         float epsilon, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  for_each_row(rows, [&](int64_t row) {
    const T* x = input + row * channels;
    T* y = output + row * channels;
    float sum = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      load_floats(xs, x + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) sum += xs[j];
    });
    const float row_mean = block_sum(sum, shared) / static_cast<float>(channels);
    float squares = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      load_floats(xs, x + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        const float deviation = xs[j] - row_mean;
        squares += deviation * deviation;
      }
    });
    // 1 / sqrtf, not rsqrtf (an approximation): the CPU's correctly rounded quotient.
    const float row_rstd =
        1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(channels) + epsilon);
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float ws[Width];
      float bs[Width];
      load_floats(xs, x + c);
      load_floats(ws, weight + c);
      load_floats(bs, bias + c);
      float ys[Width];
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        ys[j] = (xs[j] - row_mean) * row_rstd * (ws[j] + weight_offset) + bs[j];
      }
      store_floats(y + c, ys);
    });
    if (threadIdx.x == 0) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  });
}

// dinput, one block per row, Width as the forward. Each thread reads dy and x at its channels
// before writing dx there, and the sums complete (block_sum's barriers) before any write, so
// dinput may alias doutput.
template <typename T, int Width>
__global__ void layernorm_dinput_kernel(T* dinput, const T* doutput, const T* input,
                                        const T* weight, float weight_offset, const float* mean,
                                        const float* rstd, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  const float inverse_channels = 1.0f / static_cast<float>(channels);
  for_each_row(rows, [&](int64_t row) {
    const T* x = input + row * channels;
    const T* dy = doutput + row * channels;
    T* dx = dinput + row * channels;
    const float row_mean = mean[row];
    const float row_rstd = rstd[row];
    float sum_g = 0.0f;
    float sum_g_xhat = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float dys[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(dys, dy + c);
      load_floats(ws, weight + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        const float g = dys[j] * (ws[j] + weight_offset);
        sum_g += g;
        sum_g_xhat += g * (xs[j] - row_mean) * row_rstd;
      }
    });
    const float mean_g = block_sum(sum_g, shared) * inverse_channels;
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
        const float xhat = (xs[j] - row_mean) * row_rstd;
        dxs[j] = row_rstd * (dys[j] * (ws[j] + weight_offset) - mean_g - xhat * mean_g_xhat);
      }
      store_floats(dx + c, dxs);
    });
  });
}

// dweight's and dbias's column terms: dy · x̂ and dy.
template <typename T>
struct LayernormParameterTerms {
  static constexpr int kSums = 2;
  const T* doutput;
  const T* input;
  const float* mean;
  const float* rstd;
  int64_t channels;
  __device__ void add(int64_t row, int64_t c, float (&sums)[kSums]) const {
    const float dy = to_float(doutput[row * channels + c]);
    sums[0] += dy * (to_float(input[row * channels + c]) - mean[row]) * rstd[row];
    sums[1] += dy;
  }
};

}  // namespace

int64_t layernorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return detail::column_sums_scratch_floats(2, rows, channels);
}

template <typename Scalar>
void layernorm_forward(Scalar* output, float* mean, float* rstd, const Scalar* input,
                       const Scalar* weight, const Scalar* bias, float weight_offset,
                       float epsilon, int64_t rows, int64_t channels, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* y = detail::device_pointer(output);
  const T* x = detail::device_pointer(input);
  const T* w = detail::device_pointer(weight);
  const T* b = detail::device_pointer(bias);
  detail::launch_row_kernel<T>(channels, {y, x, w, b}, [&](auto width) {
    layernorm_forward_kernel<T, decltype(width)::value>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
            y, mean, rstd, x, w, b, weight_offset, epsilon, rows, channels);
  });
}

template <typename Scalar>
void layernorm_backward(Scalar* dinput, float* dweight, float* dbias, const Scalar* doutput,
                        const Scalar* input, const Scalar* weight, float weight_offset,
                        const float* mean, const float* rstd, int64_t rows, int64_t channels,
                        float* scratch, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  const T* dy = detail::device_pointer(doutput);
  const T* x = detail::device_pointer(input);
  // The parameter sums first: they read doutput, which dinput may overwrite.
  detail::launch_column_sums(detail::ColumnTargets<2>{{dweight, dbias}},
                             LayernormParameterTerms<T>{dy, x, mean, rstd, channels}, scratch,
                             rows, channels, stream);
  T* dx = detail::device_pointer(dinput);
  const T* w = detail::device_pointer(weight);
  detail::launch_row_kernel<T>(channels, {dx, dy, x, w}, [&](auto width) {
    layernorm_dinput_kernel<T, decltype(width)::value>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
            dx, dy, x, w, weight_offset, mean, rstd, rows, channels);
  });
}

#define BACKEND_INSTANTIATE_LAYERNORM_CUDA(Scalar)                                                \
  template void layernorm_forward<Scalar>(Scalar*, float*, float*, const Scalar*, const Scalar*,  \
                                          const Scalar*, float, float, int64_t, int64_t,          \
                                          CudaStream);                                            \
  template void layernorm_backward<Scalar>(Scalar*, float*, float*, const Scalar*, const Scalar*, \
                                           const Scalar*, float, const float*, const float*,      \
                                           int64_t, int64_t, float*, CudaStream);
BACKEND_INSTANTIATE_LAYERNORM_CUDA(float)
BACKEND_INSTANTIATE_LAYERNORM_CUDA(bfloat16)
BACKEND_INSTANTIATE_LAYERNORM_CUDA(float16)
#undef BACKEND_INSTANTIATE_LAYERNORM_CUDA

}  // namespace backend::cuda
