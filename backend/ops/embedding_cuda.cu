// CUDA twin of embedding.hpp (CPU twin: embedding_cpu.cpp; llm.c's encoder_forward/backward,
// GPT-2's wte + wpe; Megatron core's VocabParallelEmbedding for a shard of the vocabulary):
//   output[b, t, :]                = word[tokens[b, t] − vocab_start, :] + position[t, :]
//   dword[token − vocab_start, :] += Σ over the positions holding token of doutput[b, t, :]
//   dposition[t, :]               += Σ_b doutput[b, t, :]
// where a token outside [vocab_start, vocab_start + V) has no word row (the position row alone,
// or 0; nothing added to dword).
// Forward: one thread per element, or per 16-byte pack when C allows. Backward without
// atomics, deterministic: the caller's index (embedding.hpp's index_tokens) gives each distinct
// token its positions in ascending order; one block per distinct token owns that row of dword
// (no other block touches it). Its warps are kEmbeddingGradientGroups' groups: warp g sums the
// token's positions g, g + G, … over a tile of 32 packs of columns (coalesced 16-byte loads),
// the partials meet in shared memory and are added in group order, once, onto the row: the CPU
// twin's exact order of additions, with a frequent token's positions spread over 8 warps
// instead of one thread's loop. dposition: one thread per (t, c) sums b = 0..B−1 into a running
// sum added once, as the CPU twin.
#include <type_traits>

#include "backend/ops/cuda_common.cuh"
#include "backend/ops/embedding.hpp"

namespace backend::cuda {
namespace {

using detail::from_float;
using detail::grid_stride;
using detail::grid_stride_packs;
using detail::Pack;
using detail::to_float;

template <typename T, int Width>
__global__ void embedding_forward_kernel(T* output, const int32_t* tokens, const T* word,
                                         const T* position, int64_t rows, int64_t seq_length,
                                         int64_t hidden_size, int64_t vocab_start,
                                         int64_t vocab_size) {
  using P = Pack<T, Width>;
  for (const auto [row, c] : grid_stride_packs<Width>(rows, hidden_size)) {
    const int64_t token = int64_t{tokens[row]} - vocab_start;
    P out;
    if (token < 0 || token >= vocab_size) {  // another shard's token: the position row or 0
      if (position == nullptr) {
#pragma unroll
        for (int j = 0; j < Width; ++j) out.values[j] = from_float<T>(0.0f);
      } else {
        out = *reinterpret_cast<const P*>(position + (row % seq_length) * hidden_size + c);
      }
      *reinterpret_cast<P*>(output + row * hidden_size + c) = out;
      continue;
    }
    const P w = *reinterpret_cast<const P*>(word + token * hidden_size + c);
    if (position == nullptr) {
      out = w;
    } else {
      const P e = *reinterpret_cast<const P*>(position + (row % seq_length) * hidden_size + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        out.values[j] = from_float<T>(to_float(w.values[j]) + to_float(e.values[j]));
      }
    }
    *reinterpret_cast<P*>(output + row * hidden_size + c) = out;
  }
}

// The word table's backward block: one warp per group of the summation order.
constexpr int kGradientGroups = kEmbeddingGradientGroups;
constexpr int kWordBackwardThreads = 32 * kGradientGroups;

// One block per distinct token (blockIdx.x strides over them; the grid is sized for the most
// there can be, B·T). The index covers the whole tokens: a token outside this shard's rows is
// skipped by the whole block (the condition is the block's, so the barriers stay uniform).
// Width: elements per load, > 1 only when C is a multiple of it and doutput 16-byte aligned.
template <typename T, int Width>
__global__ void __launch_bounds__(kWordBackwardThreads)
    embedding_word_backward_kernel(float* dword, const T* doutput, const int32_t* token_index,
                                   const int32_t* order, const int32_t* segment_starts,
                                   const int32_t* unique_tokens, int64_t hidden_size,
                                   int64_t vocab_start, int64_t vocab_size) {
  using P = Pack<T, Width>;
  constexpr int kTile = 32 * Width;  // columns per pass: one pack per lane
  __shared__ float partial[kGradientGroups][kTile];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int group = static_cast<int>(threadIdx.x / 32);
  const int64_t unique_count = token_index[0];
  for (int64_t u = blockIdx.x; u < unique_count; u += gridDim.x) {
    const int64_t token = int64_t{unique_tokens[u]} - vocab_start;
    if (token < 0 || token >= vocab_size) continue;
    float* row = dword + token * hidden_size;
    const int64_t begin = segment_starts[u];
    const int64_t end = segment_starts[u + 1];
    for (int64_t tile = 0; tile < hidden_size; tile += kTile) {
      const int64_t c = tile + int64_t{lane} * Width;
      float sum[Width];
#pragma unroll
      for (int j = 0; j < Width; ++j) sum[j] = 0.0f;
      if (c < hidden_size) {  // a whole pack: C is a multiple of Width
        for (int64_t k = begin + group; k < end; k += kGradientGroups) {
          const P pack = *reinterpret_cast<const P*>(doutput + int64_t{order[k]} * hidden_size + c);
#pragma unroll
          for (int j = 0; j < Width; ++j) sum[j] += to_float(pack.values[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < Width; ++j) partial[group][lane * Width + j] = sum[j];
      __syncthreads();
      for (int i = static_cast<int>(threadIdx.x); i < kTile; i += kWordBackwardThreads) {
        if (tile + i >= hidden_size) continue;
        float total = 0.0f;
#pragma unroll
        for (int g = 0; g < kGradientGroups; ++g) total += partial[g][i];
        row[tile + i] += total;
      }
      __syncthreads();
    }
  }
}

// One thread per (t, c), coalesced along c.
template <typename T>
__global__ void embedding_position_backward_kernel(float* dposition, const T* doutput,
                                                   int64_t batch_size, int64_t seq_length,
                                                   int64_t hidden_size) {
  const int64_t count = seq_length * hidden_size;
  for (const int64_t i : grid_stride(count)) {
    float sum = 0.0f;
    for (int64_t b = 0; b < batch_size; ++b) sum += to_float(doutput[b * count + i]);
    dposition[i] += sum;
  }
}

// One thread per (row, c) of the rows at their own positions.
template <typename T>
__global__ void embedding_at_positions_kernel(T* output, const int32_t* tokens,
                                              const int32_t* positions, const T* word,
                                              const T* position, int64_t rows,
                                              int64_t hidden_size) {
  const int64_t count = rows * hidden_size;
  for (const int64_t i : grid_stride(count)) {
    const int64_t row = i / hidden_size;
    const int64_t c = i % hidden_size;
    const T w = word[int64_t{tokens[row]} * hidden_size + c];
    if (position == nullptr) {
      output[i] = w;
    } else {
      output[i] = from_float<T>(to_float(w) +
                                to_float(position[int64_t{positions[row]} * hidden_size + c]));
    }
  }
}

}  // namespace

template <typename Scalar>
void embedding_at_positions_forward(Scalar* output, const int32_t* tokens,
                                    const int32_t* positions, const Scalar* word_embeddings,
                                    const Scalar* position_embeddings, int64_t rows,
                                    int64_t hidden_size, CudaStream stream) {
  const int64_t count = rows * hidden_size;
  if (count <= 0) return;
  embedding_at_positions_kernel<<<detail::grid_for(count), detail::kBlockSize, 0, stream>>>(
      detail::device_pointer(output), tokens, positions, detail::device_pointer(word_embeddings),
      detail::device_pointer(position_embeddings), rows, hidden_size);
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void embedding_forward(Scalar* output, const int32_t* tokens, const Scalar* word_embeddings,
                       const Scalar* position_embeddings, int64_t batch_size, int64_t seq_length,
                       int64_t hidden_size, int64_t vocab_start, int64_t vocab_size,
                       CudaStream stream) {
  const int64_t rows = batch_size * seq_length;
  if (rows <= 0 || hidden_size <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* out = detail::device_pointer(output);
  const T* word = detail::device_pointer(word_embeddings);
  const T* position = detail::device_pointer(position_embeddings);
  // aligned_16(nullptr) holds, so an absent position table does not block the packs.
  detail::launch_with_pack_width<T>(hidden_size, {out, word, position}, [&](auto width) {
    embedding_forward_kernel<T, width>
        <<<detail::grid_for(rows * hidden_size / width), detail::kBlockSize, 0, stream>>>(
            out, tokens, word, position, rows, seq_length, hidden_size, vocab_start, vocab_size);
  });
}

template <typename Scalar>
void embedding_backward(float* dword_embeddings, float* dposition_embeddings, const Scalar* doutput,
                        const int32_t* token_index, int64_t batch_size, int64_t seq_length,
                        int64_t hidden_size, int64_t vocab_start, int64_t vocab_size,
                        CudaStream stream) {
  const int64_t count = batch_size * seq_length;
  if (count <= 0 || hidden_size <= 0) return;
  const auto* dy = detail::device_pointer(doutput);
  if (vocab_size > 0) {
    const TokenIndexLayout layout = token_index_layout(count);
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(dy)>>;
    detail::launch_with_pack_width<T>(hidden_size, {dy}, [&](auto width) {
      embedding_word_backward_kernel<T, width>
          <<<detail::row_grid(count), kWordBackwardThreads, 0, stream>>>(
              dword_embeddings, dy, token_index, token_index + layout.order,
              token_index + layout.segment_starts, token_index + layout.unique_tokens, hidden_size,
              vocab_start, vocab_size);
    });
  }
  if (dposition_embeddings == nullptr) return;
  embedding_position_backward_kernel<<<detail::grid_for(seq_length * hidden_size),
                                       detail::kBlockSize, 0, stream>>>(
      dposition_embeddings, dy, batch_size, seq_length, hidden_size);
  CUDA_CHECK(cudaGetLastError());
}

#define BACKEND_INSTANTIATE_EMBEDDING_CUDA(Scalar)                                                 \
  template void embedding_forward<Scalar>(Scalar*, const int32_t*, const Scalar*, const Scalar*,   \
                                          int64_t, int64_t, int64_t, int64_t, int64_t,             \
                                          CudaStream);                                             \
  template void embedding_backward<Scalar>(float*, float*, const Scalar*, const int32_t*, int64_t, \
                                           int64_t, int64_t, int64_t, int64_t, CudaStream);       \
  template void embedding_at_positions_forward<Scalar>(Scalar*, const int32_t*, const int32_t*,    \
                                                       const Scalar*, const Scalar*, int64_t,      \
                                                       int64_t, CudaStream);
BACKEND_INSTANTIATE_EMBEDDING_CUDA(float)
BACKEND_INSTANTIATE_EMBEDDING_CUDA(bfloat16)
BACKEND_INSTANTIATE_EMBEDDING_CUDA(float16)
#undef BACKEND_INSTANTIATE_EMBEDDING_CUDA

}  // namespace backend::cuda
