// CUDA twin of cross_entropy.hpp (CPU twin: cross_entropy_cpu.cpp; the fused classifier of
// llm.c, Megatron's vocab_parallel_cross_entropy at tensor parallel size 1), over the padded
// vocabulary:
//   logsumexp_i = m_i + log Σ_v exp(z[i, v] − m_i),  m_i = max_v z[i, v]
//   loss_i      = logsumexp_i − z[i, label_i]
//   dz[i, v]    = exp(z[i, v] − logsumexp_i) · scale − [v == label_i] · scale
// In float (expf, logf: CUDA's accurate ones), logits float or bf16.
// Deterministic: one block per row; each thread walks its fixed strided share of the row
// (16-byte packs when the row allows), and detail::block_max/block_sum combine the threads in
// a fixed tree. The backward is elementwise per row: a thread reads a pack of z before writing
// the same pack of dz, so dlogits may alias logits.
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

using detail::from_float;
using detail::Pack;
using detail::to_float;

// Width: elements per load. Width > 1 only when V is a multiple of it and logits are 16-byte
// aligned, so every row starts aligned; the scalar tail loop is then empty.
template <typename T, int Width>
__global__ void cross_entropy_forward_kernel(float* losses, float* logsumexp, const T* logits,
                                             const int32_t* labels, int64_t rows,
                                             int64_t vocab_size) {
  using P = Pack<T, Width>;
  __shared__ float shared[32];
  const int64_t packs = vocab_size / Width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* z = logits + row * vocab_size;
    float thread_max = -INFINITY;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P pack = *reinterpret_cast<const P*>(z + p * Width);
#pragma unroll
      for (int j = 0; j < Width; ++j) thread_max = fmaxf(thread_max, to_float(pack.values[j]));
    }
    for (int64_t v = packs * Width + threadIdx.x; v < vocab_size; v += blockDim.x) {
      thread_max = fmaxf(thread_max, to_float(z[v]));
    }
    const float row_max = detail::block_max(thread_max, shared);
    float thread_sum = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P pack = *reinterpret_cast<const P*>(z + p * Width);
#pragma unroll
      for (int j = 0; j < Width; ++j) thread_sum += expf(to_float(pack.values[j]) - row_max);
    }
    for (int64_t v = packs * Width + threadIdx.x; v < vocab_size; v += blockDim.x) {
      thread_sum += expf(to_float(z[v]) - row_max);
    }
    const float row_logsumexp = row_max + logf(detail::block_sum(thread_sum, shared));
    if (threadIdx.x == 0) {
      logsumexp[row] = row_logsumexp;
      losses[row] = row_logsumexp - to_float(z[labels[row]]);
    }
  }
}

template <typename T, int Width>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* logsumexp,
                                              const int32_t* labels, float scale, int64_t rows,
                                              int64_t vocab_size) {
  using P = Pack<T, Width>;
  const int64_t packs = vocab_size / Width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* z = logits + row * vocab_size;
    T* dz = dlogits + row * vocab_size;
    const float row_logsumexp = logsumexp[row];
    const int64_t label = labels[row];
    // As the CPU: exp · scale, then scale subtracted from the label's entry.
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P pack = *reinterpret_cast<const P*>(z + p * Width);
      P out;
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        float d = expf(to_float(pack.values[j]) - row_logsumexp) * scale;
        if (p * Width + j == label) d -= scale;
        out.values[j] = from_float<T>(d);
      }
      *reinterpret_cast<P*>(dz + p * Width) = out;
    }
    for (int64_t v = packs * Width + threadIdx.x; v < vocab_size; v += blockDim.x) {
      float d = expf(to_float(z[v]) - row_logsumexp) * scale;
      if (v == label) d -= scale;
      dz[v] = from_float<T>(d);
    }
  }
}

}  // namespace

template <typename Scalar>
void cross_entropy_forward(float* losses, float* logsumexp, const Scalar* logits,
                           const int32_t* labels, int64_t rows, int64_t vocab_size,
                           CudaStream stream) {
  if (rows <= 0 || vocab_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  constexpr int kWidth = detail::kPackWidth<T>;
  const T* z = detail::device_pointer(logits);
  if (vocab_size % kWidth == 0 && detail::aligned_16(z)) {
    cross_entropy_forward_kernel<T, kWidth>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(losses, logsumexp, z, labels,
                                                                    rows, vocab_size);
  } else {
    cross_entropy_forward_kernel<T, 1><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        losses, logsumexp, z, labels, rows, vocab_size);
  }
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits, const Scalar* logits, const float* logsumexp,
                            const int32_t* labels, float scale, int64_t rows, int64_t vocab_size,
                            CudaStream stream) {
  if (rows <= 0 || vocab_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  constexpr int kWidth = detail::kPackWidth<T>;
  T* dz = detail::device_pointer(dlogits);
  const T* z = detail::device_pointer(logits);
  if (vocab_size % kWidth == 0 && detail::aligned_16(z) && detail::aligned_16(dz)) {
    cross_entropy_backward_kernel<T, kWidth>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(dz, z, logsumexp, labels, scale,
                                                                    rows, vocab_size);
  } else {
    cross_entropy_backward_kernel<T, 1><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        dz, z, logsumexp, labels, scale, rows, vocab_size);
  }
  CUDA_CHECK(cudaGetLastError());
}

#define BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(Scalar)                                       \
  template void cross_entropy_forward<Scalar>(float*, float*, const Scalar*, const int32_t*, \
                                              int64_t, int64_t, CudaStream);                 \
  template void cross_entropy_backward<Scalar>(                                              \
      Scalar*, const Scalar*, const float*, const int32_t*, float, int64_t, int64_t, CudaStream);
BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(float)
BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(bfloat16)
#undef BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA

}  // namespace backend::cuda
