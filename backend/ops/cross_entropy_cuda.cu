// CUDA twin of cross_entropy.hpp (CPU twin: cross_entropy_cpu.cpp; the fused classifier of
// llm.c, Megatron's vocab_parallel_cross_entropy), over the padded vocabulary or a shard of it
// (columns [vocab_start, vocab_start + V)):
//   logsumexp_i = m_i + log Σ_v exp(z[i, v] − m_i),  m_i = max_v z[i, v]
//   loss_i      = logsumexp_i − z[i, label_i]
//   dz[i, v]    = exp(z[i, v] − logsumexp_i) · scale − [v + vocab_start == label_i] · scale
// The vocabulary-parallel partial is the forward's row reduction over the shard (the same
// device function, so one shard is the forward's bits) and the label's logit or 0; the
// combine is m + log Σ_k exp(part_k − m) over the parts in order, one thread per row.
// A negative label (an ignored position) gives loss 0 and a zero row of dz, as on the CPU.
// The fused classifier (forward and backward in one launch, training) takes logsumexp from an
// online softmax in one read of the row (Milakov and Gimelshein, "Online normalizer calculation
// for softmax", 2018; llm.c's fused_classifier), then writes the gradient over the logits.
// In float (expf, logf: CUDA's accurate ones), logits float or bf16. The fused classifier's
// scale may be read from device memory when it runs (a captured step's, cross_entropy.hpp).
// Deterministic: one block per row; each thread walks its fixed strided share of the row
// (16-byte packs when the row allows), and detail::block_max/block_sum combine the threads in
// a fixed tree. The backward is elementwise per row: a thread reads a pack of z before writing
// the same pack of dz, so dlogits may alias logits.
#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

using detail::from_float;
using detail::grid_stride;
using detail::Pack;
using detail::to_float;

// log Σ_v exp(z[v]) of one row of V logits, returned to every thread of the block (all of
// them must call it). Width: elements per load. Width > 1 only when V is a multiple of it and
// logits are 16-byte aligned, so every row starts aligned; the scalar tail loop is then empty.
// V = 0 gives −∞ + log 0 = −∞ (an empty shard: nothing to add).
template <typename T, int Width>
__device__ __forceinline__ float block_row_logsumexp(const T* z, int64_t vocab_size,
                                                     float* shared) {
  using P = Pack<T, Width>;
  const int64_t packs = vocab_size / Width;
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
  return row_max + logf(detail::block_sum(thread_sum, shared));
}

// What a row's logsumexp becomes, written by the row's thread 0: the forward's loss, or a
// vocabulary-parallel shard's partial (its logsumexp and the label's logit when the label is
// in the shard, else 0).
struct LossOfRow {
  float* losses;
  float* logsumexp;
  const int32_t* labels;
  template <typename T>
  __device__ void operator()(int64_t row, float row_logsumexp, const T* z, int64_t) const {
    logsumexp[row] = row_logsumexp;
    losses[row] = labels[row] < 0 ? 0.0f : row_logsumexp - to_float(z[labels[row]]);
  }
};
struct PartialOfRow {
  float* logsumexp_part;
  float* target_logit;
  const int32_t* labels;
  int64_t vocab_start;
  template <typename T>
  __device__ void operator()(int64_t row, float row_logsumexp, const T* z,
                             int64_t vocab_size) const {
    logsumexp_part[row] = row_logsumexp;
    const int64_t label = int64_t{labels[row]} - vocab_start;
    target_logit[row] = label >= 0 && label < vocab_size ? to_float(z[label]) : 0.0f;
  }
};

template <typename T, int Width, typename Finish>
__global__ void row_logsumexp_kernel(const T* logits, int64_t rows, int64_t vocab_size,
                                     Finish finish) {
  __shared__ float shared[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* z = logits + row * vocab_size;
    const float row_logsumexp = block_row_logsumexp<T, Width>(z, vocab_size, shared);
    if (threadIdx.x == 0) finish(row, row_logsumexp, z, vocab_size);
  }
}

// One thread per row; parts (P, N) part-major. expf(±0) = 1 and logf(1) = +0 exactly (CUDA's
// documented special values), so one part passes through: the forward's bits.
__global__ void vocab_parallel_combine_kernel(float* losses, float* logsumexp,
                                              const float* logsumexp_parts,
                                              const float* target_logit,
                                              const int32_t* labels, int64_t rows,
                                              int64_t parts) {
  for (const int64_t row : grid_stride(rows)) {
    const float* part = logsumexp_parts + row;  // part[k * rows]: part k's value
    float part_max = part[0];
    for (int64_t k = 1; k < parts; ++k) part_max = fmaxf(part_max, part[k * rows]);
    float sum = 0.0f;
    for (int64_t k = 0; k < parts; ++k) sum += expf(part[k * rows] - part_max);
    const float row_logsumexp = part_max + logf(sum);
    logsumexp[row] = row_logsumexp;
    losses[row] = labels[row] < 0 ? 0.0f : row_logsumexp - target_logit[row];
  }
}

// One row's gradient, by the whole block: dz = exp(z − logsumexp) · scale, minus scale at the
// label's column (of this shard: off the shard it is negative or ≥ V and matches none), as the
// CPU; an ignored position's row is zero. dz may be z: each thread reads a pack before it
// writes the same pack.
template <typename T, int Width>
__device__ __forceinline__ void write_row_gradient(T* dz, const T* z, float row_logsumexp,
                                                   bool ignored, int64_t label, float scale,
                                                   int64_t vocab_size) {
  using P = Pack<T, Width>;
  const int64_t packs = vocab_size / Width;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const P pack = *reinterpret_cast<const P*>(z + p * Width);
    P out;
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      float d = ignored ? 0.0f : expf(to_float(pack.values[j]) - row_logsumexp) * scale;
      if (p * Width + j == label) d -= scale;
      out.values[j] = from_float<T>(d);
    }
    *reinterpret_cast<P*>(dz + p * Width) = out;
  }
  for (int64_t v = packs * Width + threadIdx.x; v < vocab_size; v += blockDim.x) {
    float d = ignored ? 0.0f : expf(to_float(z[v]) - row_logsumexp) * scale;
    if (v == label) d -= scale;
    dz[v] = from_float<T>(d);
  }
}

template <typename T, int Width>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* logsumexp,
                                              const int32_t* labels, float scale,
                                              const double* stored_scale, int64_t rows,
                                              int64_t vocab_size, int64_t vocab_start) {
  if (stored_scale != nullptr) scale = static_cast<float>(*stored_scale);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const bool ignored = labels[row] < 0;
    write_row_gradient<T, Width>(
        dlogits + row * vocab_size, logits + row * vocab_size, logsumexp[row], ignored,
        ignored ? -1 : int64_t{labels[row]} - vocab_start, scale, vocab_size);
  }
}

// The online softmax's step (Milakov and Gimelshein 2018): the running maximum m and
// s = Σ exp(x − m) of the values seen, rescaled when x raises the maximum.
__device__ __forceinline__ void online_softmax_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// The fused classifier, one block per row: each thread's online (m, s) over its strided share,
// combined over the block (the maximum, then Σ s · exp(m − maximum) in block_sum's fixed tree),
// the loss from the label's logit (read by thread 0 before the first barrier, so before any
// thread overwrites it), then the row's gradient in place. A thread that saw nothing keeps
// (−∞, 0) and adds 0 · exp(−∞) = 0.
template <typename T, int Width>
__global__ void cross_entropy_forward_backward_kernel(float* losses, float* logsumexp, T* logits,
                                                      const int32_t* labels, float scale,
                                                      const double* stored_scale, int64_t rows,
                                                      int64_t vocab_size) {
  using P = Pack<T, Width>;
  if (stored_scale != nullptr) scale = static_cast<float>(*stored_scale);
  __shared__ float shared[32];
  const int64_t packs = vocab_size / Width;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* z = logits + row * vocab_size;
    const int64_t label = labels[row];
    const bool ignored = label < 0;
    const float target_logit = threadIdx.x == 0 && !ignored ? to_float(z[label]) : 0.0f;
    float thread_max = -INFINITY;
    float thread_sum = 0.0f;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P pack = *reinterpret_cast<const P*>(z + p * Width);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        online_softmax_add(to_float(pack.values[j]), thread_max, thread_sum);
      }
    }
    for (int64_t v = packs * Width + threadIdx.x; v < vocab_size; v += blockDim.x) {
      online_softmax_add(to_float(z[v]), thread_max, thread_sum);
    }
    const float row_max = detail::block_max(thread_max, shared);
    const float rescaled = thread_sum == 0.0f ? 0.0f : thread_sum * expf(thread_max - row_max);
    const float row_logsumexp = row_max + logf(detail::block_sum(rescaled, shared));
    if (threadIdx.x == 0) {
      logsumexp[row] = row_logsumexp;
      losses[row] = ignored ? 0.0f : row_logsumexp - target_logit;
    }
    write_row_gradient<T, Width>(z, z, row_logsumexp, ignored, label, scale, vocab_size);
  }
}

}  // namespace

template <typename Scalar>
void cross_entropy_forward(float* losses, float* logsumexp, const Scalar* logits,
                           const int32_t* labels, int64_t rows, int64_t vocab_size,
                           CudaStream stream) {
  if (rows <= 0 || vocab_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  const T* z = detail::device_pointer(logits);
  detail::launch_with_pack_width<T>(vocab_size, {z}, [&](auto width) {
    row_logsumexp_kernel<T, width><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        z, rows, vocab_size, LossOfRow{losses, logsumexp, labels});
  });
}

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits, const Scalar* logits, const float* logsumexp,
                            const int32_t* labels, float scale, const double* stored_scale,
                            int64_t rows, int64_t vocab_size, int64_t vocab_start,
                            CudaStream stream) {
  if (rows <= 0 || vocab_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* dz = detail::device_pointer(dlogits);
  const T* z = detail::device_pointer(logits);
  detail::launch_with_pack_width<T>(vocab_size, {z, dz}, [&](auto width) {
    cross_entropy_backward_kernel<T, width>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
            dz, z, logsumexp, labels, scale, stored_scale, rows, vocab_size, vocab_start);
  });
}

template <typename Scalar>
void cross_entropy_forward_backward(float* losses, float* logsumexp, Scalar* logits,
                                    const int32_t* labels, float scale, const double* stored_scale,
                                    int64_t rows, int64_t vocab_size, CudaStream stream) {
  if (rows <= 0 || vocab_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* z = detail::device_pointer(logits);
  detail::launch_with_pack_width<T>(vocab_size, {z}, [&](auto width) {
    cross_entropy_forward_backward_kernel<T, width>
        <<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
            losses, logsumexp, z, labels, scale, stored_scale, rows, vocab_size);
  });
}

template <typename Scalar>
void vocab_parallel_cross_entropy_partial(float* logsumexp_part, float* target_logit,
                                          const Scalar* logits, const int32_t* labels, int64_t rows,
                                          int64_t vocab_size, int64_t vocab_start,
                                          CudaStream stream) {
  // An empty shard (V = 0) still writes its rows: −∞ and 0.
  if (rows <= 0 || vocab_size < 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  const T* z = detail::device_pointer(logits);
  detail::launch_with_pack_width<T>(vocab_size, {z}, [&](auto width) {
    row_logsumexp_kernel<T, width><<<detail::row_grid(rows), detail::kBlockSize, 0, stream>>>(
        z, rows, vocab_size, PartialOfRow{logsumexp_part, target_logit, labels, vocab_start});
  });
}

void vocab_parallel_cross_entropy_combine(float* losses, float* logsumexp,
                                          const float* logsumexp_parts, const float* target_logit,
                                          const int32_t* labels, int64_t rows, int64_t parts,
                                          CudaStream stream) {
  if (rows <= 0 || parts <= 0) return;
  vocab_parallel_combine_kernel<<<detail::grid_for(rows), detail::kBlockSize, 0, stream>>>(
      losses, logsumexp, logsumexp_parts, target_logit, labels, rows, parts);
  CUDA_CHECK(cudaGetLastError());
}

#define BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(Scalar)                                          \
  template void cross_entropy_forward<Scalar>(float*, float*, const Scalar*, const int32_t*,    \
                                              int64_t, int64_t, CudaStream);                    \
  template void cross_entropy_backward<Scalar>(Scalar*, const Scalar*, const float*,            \
                                               const int32_t*, float, const double*, int64_t,   \
                                               int64_t, int64_t, CudaStream);                   \
  template void cross_entropy_forward_backward<Scalar>(float*, float*, Scalar*, const int32_t*, \
                                                       float, const double*, int64_t, int64_t,  \
                                                       CudaStream);                             \
  template void vocab_parallel_cross_entropy_partial<Scalar>(                                   \
      float*, float*, const Scalar*, const int32_t*, int64_t, int64_t, int64_t, CudaStream);
BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(float)
BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(bfloat16)
BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA(float16)
#undef BACKEND_INSTANTIATE_CROSS_ENTROPY_CUDA

}  // namespace backend::cuda
