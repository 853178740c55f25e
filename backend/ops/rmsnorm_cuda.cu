// CUDA twin of rmsnorm.hpp (CPU twin: rmsnorm_cpu.cpp; Megatron's RMSNorm):
//   rstd = 1 / sqrt(Σ x² / C + ε),  x̂ = x · rstd,  y = x̂ · w
//   dx = rstd · (g − x̂ · mean(g · x̂)),  g = dy · w
//   dw += Σ_rows dy · x̂
// Everything in float; Scalar (float or bf16) is only read and written.
// Deterministic without atomics, as layernorm_cuda.cu: one block per row (16-byte packs along
// it where C and the pointers allow) with detail::block_sum's fixed tree, and dw as
// per-row-group partials in row order into `scratch`, added in group order by a second kernel
// (detail::row_groups, cuda_common.cuh).
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/rmsnorm.hpp"

namespace backend::cuda {
namespace {

using detail::block_sum;
using detail::load_floats;
using detail::store_floats;
using detail::to_float;

// Each thread takes Width consecutive channels at a time (one 16-byte pack when Width > 1,
// which the launcher picks only when detail::rows_vectorise allows), with a stride of the block.
template <typename T, int Width>
__global__ void rmsnorm_forward_kernel(T* output, float* rstd, const T* input, const T* weight,
                                       float epsilon, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  const int64_t first = static_cast<int64_t>(threadIdx.x) * Width;
  const int64_t step = static_cast<int64_t>(blockDim.x) * Width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * channels;
    T* y = output + row * channels;
    float squares = 0.0f;
    for (int64_t c = first; c < channels; c += step) {
      float xs[Width];
      load_floats(xs, x + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) squares += xs[j] * xs[j];
    }
    // 1 / sqrtf, not rsqrtf (an approximation): the CPU's correctly rounded quotient.
    const float row_rstd =
        1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(channels) + epsilon);
    for (int64_t c = first; c < channels; c += step) {
      float xs[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(ws, weight + c);
      float ys[Width];
#pragma unroll
      for (int j = 0; j < Width; ++j) ys[j] = xs[j] * row_rstd * ws[j];
      store_floats(y + c, ys);
    }
    if (threadIdx.x == 0) rstd[row] = row_rstd;
  }
}

// dinput, one block per row, Width as the forward; reads at a channel precede its write and
// the sum completes before any write, so dinput may alias doutput.
template <typename T, int Width>
__global__ void rmsnorm_dinput_kernel(T* dinput, const T* doutput, const T* input, const T* weight,
                                      const float* rstd, int64_t rows, int64_t channels) {
  __shared__ float shared[32];
  const float inverse_channels = 1.0f / static_cast<float>(channels);
  const int64_t first = static_cast<int64_t>(threadIdx.x) * Width;
  const int64_t step = static_cast<int64_t>(blockDim.x) * Width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = input + row * channels;
    const T* dy = doutput + row * channels;
    T* dx = dinput + row * channels;
    const float row_rstd = rstd[row];
    float sum_g_xhat = 0.0f;
    for (int64_t c = first; c < channels; c += step) {
      float xs[Width];
      float dys[Width];
      float ws[Width];
      load_floats(xs, x + c);
      load_floats(dys, dy + c);
      load_floats(ws, weight + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) sum_g_xhat += dys[j] * ws[j] * xs[j] * row_rstd;
    }
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) * inverse_channels;
    for (int64_t c = first; c < channels; c += step) {
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
    }
  }
}

// Partial column sums of dy · x̂ over one row group (blockIdx.y), rows in order; scratch (G, C).
template <typename T>
__global__ void rmsnorm_column_partials_kernel(float* scratch, const T* doutput, const T* input,
                                               const float* rstd, int64_t rows, int64_t channels,
                                               int64_t group_rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int64_t group = blockIdx.y;
  const int64_t begin = group * group_rows;
  const int64_t end = begin + group_rows < rows ? begin + group_rows : rows;
  float weight_sum = 0.0f;
  for (int64_t row = begin; row < end; ++row) {
    weight_sum +=
        to_float(doutput[row * channels + c]) * to_float(input[row * channels + c]) * rstd[row];
  }
  scratch[group * channels + c] = weight_sum;
}

// dweight[c] += Σ_g partial[g, c] in group order.
__global__ void rmsnorm_column_finish_kernel(float* dweight, const float* scratch, int64_t channels,
                                             int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < channels;
       c += stride) {
    float weight_sum = 0.0f;
    for (int64_t group = 0; group < groups; ++group) weight_sum += scratch[group * channels + c];
    dweight[c] += weight_sum;
  }
}

}  // namespace

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t channels) {
  return detail::row_groups(rows) * channels;
}

template <typename Scalar>
void rmsnorm_forward(Scalar* output, float* rstd, const Scalar* input, const Scalar* weight,
                     float epsilon, int64_t rows, int64_t channels, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* y = detail::device_pointer(output);
  const T* x = detail::device_pointer(input);
  const T* w = detail::device_pointer(weight);
  if (detail::rows_vectorise<T>(channels, {y, x, w})) {
    rmsnorm_forward_kernel<T, detail::kPackWidth<T>>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(y, rstd, x, w, epsilon, rows,
                                                                    channels);
  } else {
    rmsnorm_forward_kernel<T, 1><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        y, rstd, x, w, epsilon, rows, channels);
  }
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput, float* dweight, const Scalar* doutput, const Scalar* input,
                      const Scalar* weight, const float* rstd, int64_t rows, int64_t channels,
                      float* scratch, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  const auto* dy = detail::device_pointer(doutput);
  const auto* x = detail::device_pointer(input);
  // The parameter sum first: it reads doutput, which dinput may overwrite.
  const int64_t groups = detail::row_groups(rows);
  const dim3 partial_grid(
      static_cast<unsigned>((channels + detail::kBlockSize - 1) / detail::kBlockSize),
      static_cast<unsigned>(groups));
  rmsnorm_column_partials_kernel<<<partial_grid, detail::kBlockSize, 0, stream>>>(
      scratch, dy, x, rstd, rows, channels, detail::rows_per_group(rows));
  CUDA_CHECK(cudaGetLastError());
  rmsnorm_column_finish_kernel<<<detail::grid_for(channels), detail::kBlockSize, 0, stream>>>(
      dweight, scratch, channels, groups);
  CUDA_CHECK(cudaGetLastError());
  using T = detail::DeviceElementOf<Scalar>;
  T* dx = detail::device_pointer(dinput);
  const T* w = detail::device_pointer(weight);
  if (detail::rows_vectorise<T>(channels, {dx, dy, x, w})) {
    rmsnorm_dinput_kernel<T, detail::kPackWidth<T>>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(dx, dy, x, w, rstd, rows,
                                                                    channels);
  } else {
    rmsnorm_dinput_kernel<T, 1><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        dx, dy, x, w, rstd, rows, channels);
  }
  CUDA_CHECK(cudaGetLastError());
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
