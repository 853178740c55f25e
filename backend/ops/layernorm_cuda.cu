// CUDA twin of layernorm.hpp (CPU twin: layernorm_cpu.cpp; the layout of llm.c's
// layernorm_forward/backward and Megatron's FusedLayerNorm):
//   mean = Σ x / C,  rstd = 1 / sqrt(Σ (x − mean)² / C + ε),  x̂ = (x − mean) · rstd
//   y = x̂ · w + b
//   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂,   db += Σ_rows dy
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics: one block per row with detail::block_sum's fixed tree for the
// row sums (two passes, mean then squared deviations, as the CPU: E[x²] − E[x]² cancels); the
// column sums of dw and db are per-row-group partials in row order into `scratch`, then a
// second kernel adds the groups in order (detail::row_groups, cuda_common.cuh).
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/layernorm.hpp"

namespace backend::cuda {
namespace {

using detail::block_sum;
using detail::from_float;
using detail::to_float;

template <typename T>
__global__ void layernorm_forward_kernel(T* output, float* mean, float* rstd, const T* input,
                                         const T* weight, const T* bias, float epsilon,
                                         int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * channels;
    T* y = output + row * channels;
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) sum += to_float(x[c]);
    const float row_mean = block_sum(sum, shared) / static_cast<float>(channels);
    float squares = 0.0f;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const float deviation = to_float(x[c]) - row_mean;
      squares += deviation * deviation;
    }
    // 1 / sqrtf, not rsqrtf (an approximation): the CPU's correctly rounded quotient.
    const float row_rstd =
        1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(channels) + epsilon);
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      y[c] = from_float<T>((to_float(x[c]) - row_mean) * row_rstd * to_float(weight[c]) +
                           to_float(bias[c]));
    }
    if (threadIdx.x == 0) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  }
}

// dinput, one block per row. Each thread reads dy[c] and x[c] before writing dx[c], and the
// sums complete (block_sum's barriers) before any write, so dinput may alias doutput.
template <typename T>
__global__ void layernorm_dinput_kernel(T* dinput, const T* doutput, const T* input,
                                        const T* weight, const float* mean, const float* rstd,
                                        int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  const float inverse_channels = 1.0f / static_cast<float>(channels);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * channels;
    const T* dy = doutput + row * channels;
    T* dx = dinput + row * channels;
    const float row_mean = mean[row];
    const float row_rstd = rstd[row];
    float sum_g = 0.0f;
    float sum_g_xhat = 0.0f;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const float g = to_float(dy[c]) * to_float(weight[c]);
      sum_g += g;
      sum_g_xhat += g * (to_float(x[c]) - row_mean) * row_rstd;
    }
    const float mean_g = block_sum(sum_g, shared) * inverse_channels;
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) * inverse_channels;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      const float xhat = (to_float(x[c]) - row_mean) * row_rstd;
      const float g = to_float(dy[c]) * to_float(weight[c]);
      dx[c] = from_float<T>(row_rstd * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

// Partial column sums of dy · x̂ and dy over one row group (blockIdx.y), rows in order; a
// thread per column (coalesced along the row). scratch: [weight partials (G, C) | bias (G, C)].
template <typename T>
__global__ void layernorm_column_partials_kernel(float* scratch, const T* doutput, const T* input,
                                                 const float* mean, const float* rstd,
                                                 int64_t rows, int64_t channels,
                                                 int64_t group_rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int64_t group = blockIdx.y;
  const int64_t groups = gridDim.y;
  const int64_t begin = group * group_rows;
  const int64_t end = begin + group_rows < rows ? begin + group_rows : rows;
  float weight_sum = 0.0f;
  float bias_sum = 0.0f;
  for (int64_t row = begin; row < end; ++row) {
    const float dy = to_float(doutput[row * channels + c]);
    weight_sum += dy * (to_float(input[row * channels + c]) - mean[row]) * rstd[row];
    bias_sum += dy;
  }
  scratch[group * channels + c] = weight_sum;
  scratch[(groups + group) * channels + c] = bias_sum;
}

// dweight[c] += Σ_g partial[g, c] in group order (and dbias the same).
__global__ void layernorm_column_finish_kernel(float* dweight, float* dbias, const float* scratch,
                                               int64_t channels, int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < channels;
       c += stride) {
    float weight_sum = 0.0f;
    float bias_sum = 0.0f;
    for (int64_t group = 0; group < groups; ++group) {
      weight_sum += scratch[group * channels + c];
      bias_sum += scratch[(groups + group) * channels + c];
    }
    dweight[c] += weight_sum;
    dbias[c] += bias_sum;
  }
}

}  // namespace

int64_t layernorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return 2 * detail::row_groups(rows) * channels;
}

template <typename Scalar>
void layernorm_forward(Scalar* output, float* mean, float* rstd, const Scalar* input,
                       const Scalar* weight, const Scalar* bias, float epsilon, int64_t rows,
                       int64_t channels, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  layernorm_forward_kernel<<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
      detail::device_pointer(output), mean, rstd, detail::device_pointer(input),
      detail::device_pointer(weight), detail::device_pointer(bias), epsilon, rows, channels);
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void layernorm_backward(Scalar* dinput, float* dweight, float* dbias, const Scalar* doutput,
                        const Scalar* input, const Scalar* weight, const float* mean,
                        const float* rstd, int64_t rows, int64_t channels, float* scratch,
                        CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  const auto* dy = detail::device_pointer(doutput);
  const auto* x = detail::device_pointer(input);
  // The parameter sums first: they read doutput, which dinput may overwrite.
  const int64_t groups = detail::row_groups(rows);
  const dim3 partial_grid(
      static_cast<unsigned>((channels + detail::kBlockSize - 1) / detail::kBlockSize),
      static_cast<unsigned>(groups));
  layernorm_column_partials_kernel<<<partial_grid, detail::kBlockSize, 0, stream>>>(
      scratch, dy, x, mean, rstd, rows, channels, detail::rows_per_group(rows));
  CUDA_CHECK(cudaGetLastError());
  layernorm_column_finish_kernel<<<detail::grid_for(channels), detail::kBlockSize, 0, stream>>>(
      dweight, dbias, scratch, channels, groups);
  CUDA_CHECK(cudaGetLastError());
  layernorm_dinput_kernel<<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
      detail::device_pointer(dinput), dy, x, detail::device_pointer(weight), mean, rstd, rows,
      channels);
  CUDA_CHECK(cudaGetLastError());
}

#define BACKEND_INSTANTIATE_LAYERNORM_CUDA(Scalar)                                              \
  template void layernorm_forward<Scalar>(Scalar*, float*, float*, const Scalar*, const Scalar*, \
                                          const Scalar*, float, int64_t, int64_t, CudaStream);  \
  template void layernorm_backward<Scalar>(Scalar*, float*, float*, const Scalar*,              \
                                           const Scalar*, const Scalar*, const float*,          \
                                           const float*, int64_t, int64_t, float*, CudaStream);
BACKEND_INSTANTIATE_LAYERNORM_CUDA(float)
BACKEND_INSTANTIATE_LAYERNORM_CUDA(bfloat16)
#undef BACKEND_INSTANTIATE_LAYERNORM_CUDA

}  // namespace backend::cuda
