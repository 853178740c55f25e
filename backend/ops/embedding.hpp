// Token + learned position embedding at the bottom of a GPT decoder (Megatron core's
// LanguageModelEmbedding without dropout; GPT-2's wte + wpe; llm.c's encoder_forward):
//   output[b, t, :] = word_embeddings[tokens[b, t], :] + position_embeddings[t, :]
// Backward scatters the output gradient into both tables:
//   dword_embeddings[tokens[b, t], :] += doutput[b, t, :]
//   dposition_embeddings[t, :]        += Σ_b doutput[b, t, :]
// With rotary positions (--position-embedding-type rope) there is no position table:
// position_embeddings and dposition_embeddings are then nullptr and only the word row is used.
//
// Vocabulary shards (tensor parallelism: Megatron core's VocabParallelEmbedding): the word
// table holds the rows of tokens [vocab_start, vocab_start + V) only. A token outside that
// range contributes no word row: its output is the position row alone (0 without a position
// table) and the backward adds nothing to dword for it (dposition still gets every position).
// Megatron zeroes such rows and all-reduces the shards' outputs; here the caller passes the
// position table to one shard only, so the shards' outputs sum to the full embedding exactly
// (x + 0 = x). vocab_start = 0 with the whole table is the unsharded op, bit for bit.
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Tokens are ids of the whole vocabulary (GptModel validates them before calling), and the
// position table has at least T rows. Repeated tokens are summed in (b, t) order, so the
// result does not depend on the thread count.
// Dimensions: B batch, T sequence, C hidden, V rows of the word table (of this shard).
#pragma once

#include <cstdint>

#include "backend/common/error.hpp"
#include "backend/device/cuda_stream.hpp"
#include "backend/device/element_type.hpp"

namespace backend::cpu {

template <typename Scalar>
void embedding_forward(Scalar* output,                     // (B, T, C)
                       const int32_t* tokens,              // (B, T)
                       const Scalar* word_embeddings,      // (V, C): tokens vocab_start + [0, V)
                       const Scalar* position_embeddings,  // (≥ T, C) or nullptr
                       int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                       int64_t vocab_start, int64_t vocab_size);

template <typename Scalar>
void embedding_backward(Scalar* dword_embeddings,      // (V, C)   +=
                        Scalar* dposition_embeddings,  // (≥ T, C) +=, or nullptr
                        const Scalar* doutput,         // (B, T, C)
                        const int32_t* tokens,         // (B, T)
                        int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                        int64_t vocab_start, int64_t vocab_size);

// Rows at positions of their own (incremental decoding, model/gpt_decoder.hpp: the packed rows
// of a step belong to several sequences at several positions), the whole vocabulary:
//   output[r, :] = word_embeddings[tokens[r], :] + position_embeddings[positions[r], :]
// (the word row alone when position_embeddings is nullptr). The caller validated the tokens
// (< V) and positions (< the position table's rows). Forward only: decoding trains nothing.
template <typename Scalar>
void embedding_at_positions_forward(Scalar* output,                     // (N, C)
                                    const int32_t* tokens,              // (N)
                                    const int32_t* positions,           // (N)
                                    const Scalar* word_embeddings,      // (V, C)
                                    const Scalar* position_embeddings,  // (> max position, C)
                                    int64_t rows, int64_t hidden_size);

}  // namespace backend::cpu

// ---- the CUDA twin's deterministic backward
// The word table's gradient is a scatter-add where several positions may hold one token. The
// CUDA twin does it without atomics from an index of the positions grouped by token, made on
// the host from the host's copy of the tokens (B·T ints, before they are uploaded, so no
// device-to-host copy), then copied to device memory by the caller:
//   order           (count)     the positions 0..count−1, stably sorted by token (so each
//                               token's positions ascend)
//   unique_tokens   (≤ count)   the distinct tokens, ascending; *unique_count of them
//   segment_starts  (≤ count+1) token unique_tokens[u] holds the positions
//                               order[segment_starts[u] .. segment_starts[u + 1]), and
//                               segment_starts[*unique_count] = count
// Capacity: order and unique_tokens count entries, segment_starts count + 1.
// (embedding_cpu.cpp does not need it; it is pure C++, any device's caller may use it.)
namespace backend {

void sort_positions_by_token(const int32_t* tokens, int64_t count, int32_t* order,
                             int32_t* segment_starts, int32_t* unique_tokens,
                             int64_t* unique_count);

// Both devices' check: the rows V of a (V, hidden_size) word table (or its gradient) of
// `numel` elements, the vocabulary shard it holds; an empty one (a gradient not needed) none.
inline int64_t embedding_table_rows(int64_t numel, int64_t hidden_size, const char* op) {
  if (hidden_size <= 0) return 0;
  if (numel % hidden_size != 0) {
    common::fail("{}: a table of {} elements is not whole rows of hidden size {}", op, numel,
                 hidden_size);
  }
  return numel / hidden_size;
}

}  // namespace backend

// The CUDA twin (embedding_cuda.cu), tables and output float, bfloat16 or float16; the gradients of
// the tables (fp32 main grads) are float whatever Scalar is. The backward takes the index of
// sort_positions_by_token (device copies, and unique_count on the host) after the CPU twin's
// parameters: one block per distinct token adds its positions' gradient rows in position order
// onto dword's row (the CPU's order of additions: the same bits in fp32), and one thread per
// (t, c) sums the batch in order b = 0..B−1 for dposition. No atomics: a run repeats its bits.
// The index is made from the whole tokens; a block skips a token outside this shard's rows.
namespace backend::cuda {

template <typename Scalar>
void embedding_forward(Scalar* output,                     // (B, T, C)
                       const int32_t* tokens,              // (B, T)
                       const Scalar* word_embeddings,      // (V, C): tokens vocab_start + [0, V)
                       const Scalar* position_embeddings,  // (≥ T, C) or nullptr
                       int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                       int64_t vocab_start, int64_t vocab_size, CudaStream stream);

template <typename Scalar>
void embedding_backward(float* dword_embeddings,      // (V, C)   +=
                        float* dposition_embeddings,  // (≥ T, C) +=, or nullptr
                        const Scalar* doutput,        // (B, T, C)
                        const int32_t* tokens,        // (B, T) (the index below replaces it)
                        int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                        int64_t vocab_start, int64_t vocab_size,
                        const int32_t* order,           // (B·T) sort_positions_by_token's
                        const int32_t* segment_starts,  // (unique_count + 1)
                        const int32_t* unique_tokens,   // (unique_count)
                        int64_t unique_count, CudaStream stream);

// One thread per element; the sum in float (bf16 read and written only), as the CPU's.
template <typename Scalar>
void embedding_at_positions_forward(Scalar* output, const int32_t* tokens,
                                    const int32_t* positions, const Scalar* word_embeddings,
                                    const Scalar* position_embeddings, int64_t rows,
                                    int64_t hidden_size, CudaStream stream);

}  // namespace backend::cuda
