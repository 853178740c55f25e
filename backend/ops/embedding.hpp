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
// position table has at least T rows. Repeated tokens are summed in a fixed order (below), so
// the result does not depend on the thread count or the device.
// Dimensions: B batch, T sequence, C hidden, V rows of the word table (of this shard).
#pragma once

#include <cstdint>

#include "backend/common/error.hpp"
#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void embedding_forward(Scalar* output,                     // (B, T, C)
                       const int32_t* tokens,              // (B, T)
                       const Scalar* word_embeddings,      // (V, C): tokens vocab_start + [0, V)
                       const Scalar* position_embeddings,  // (≥ T, C) or nullptr
                       int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                       int64_t vocab_start, int64_t vocab_size);

// The backward takes the tokens' index (token_index below) in place of the tokens: each
// distinct token's gradient is summed in kEmbeddingGradientGroups' fixed order and added onto
// its row of dword once (threads own rows and column ranges, never share one).
template <typename Scalar>
void embedding_backward(Scalar* dword_embeddings,      // (V, C)   +=
                        Scalar* dposition_embeddings,  // (≥ T, C) +=, or nullptr
                        const Scalar* doutput,         // (B, T, C)
                        const int32_t* token_index,    // token_index_elements(B·T)
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

// ---- the backward's index of the tokens
// The word table's gradient is a scatter-add where several positions may hold one token. Both
// twins do it from an index of the positions grouped by token, so that each distinct token's
// row has one owner (no atomics on the GPU, no shared rows between CPU threads) and its
// positions are added in ascending order (the same bits on every device and thread count).
// The model makes it on the host from the host's tokens when it uploads them (B·T ints: the
// GPU never copies the tokens back, and the host never waits for it) into one i32 buffer of
// token_index_elements(count) elements:
//   [0]                                U, the number of distinct tokens
//   order          [1, 1 + N)          the positions 0..N−1, stably sorted by token (so each
//                                      token's positions ascend)
//   segment_starts [1 + N, 2 + 2N)     U + 1 used: token u holds the positions
//                                      order[segment_starts[u] .. segment_starts[u + 1]), and
//                                      segment_starts[U] = N
//   unique_tokens  [2 + 2N, 2 + 3N)    U used: the distinct tokens, ascending
// It covers the whole tokens; a vocabulary shard's backward skips the tokens it does not hold.
namespace backend {

// The order in which both twins sum a token's gradient rows, so that a frequent token's many
// positions are summed in parallel on the GPU (a token's k-th position, k = 0..n−1 in position
// order, goes to group k mod G; the groups run side by side) and the sum still has one order:
//   partial_g = 0 + d_g + d_(g+G) + d_(g+2G) + …      (ascending k)
//   total     = 0 + partial_0 + partial_1 + … + partial_(G−1)
//   dword[token, :] += total
// in the gradient's type (fp32 on a GPU). A token seen once adds its row unchanged.
inline constexpr int kEmbeddingGradientGroups = 8;

inline int64_t token_index_elements(int64_t count) { return 3 * count + 2; }

// Offsets of the index's parts from its start, for `count` positions.
struct TokenIndexLayout {
  int64_t order, segment_starts, unique_tokens;
};
inline TokenIndexLayout token_index_layout(int64_t count) {
  return {1, 1 + count, 2 + 2 * count};
}

// Writes the index of tokens[0 .. count) into index[0 .. token_index_elements(count)).
// common::Error if count does not fit the index's int32 positions.
void index_tokens(const int32_t* tokens, int64_t count, int32_t* index);

// Both devices' check of an index's size for `count` positions, naming the op.
inline void check_token_index(int64_t numel, int64_t count, const char* op) {
  if (numel != token_index_elements(count)) {
    common::fail("{}: a token index of {} elements for {} positions, which take {} "
                 "(index_tokens in backend/ops/embedding.hpp)",
                 op, numel, count, token_index_elements(count));
  }
}

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
// the tables (fp32 main grads) are float whatever Scalar is. The backward reads the index (device
// memory, its distinct-token count included, so the host need not know it): one block per
// distinct token, a warp per group of kEmbeddingGradientGroups' order (the CPU's order of
// additions: the same bits in fp32), and one thread per (t, c) sums the batch in order
// b = 0..B−1 for dposition. No atomics: a run repeats its bits.
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
                        const int32_t* token_index,   // token_index_elements(B·T)
                        int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                        int64_t vocab_start, int64_t vocab_size, CudaStream stream);

// One thread per element; the sum in float (bf16 read and written only), as the CPU's.
template <typename Scalar>
void embedding_at_positions_forward(Scalar* output, const int32_t* tokens,
                                    const int32_t* positions, const Scalar* word_embeddings,
                                    const Scalar* position_embeddings, int64_t rows,
                                    int64_t hidden_size, CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory. The word table (and its gradient) holds the rows of tokens
// [vocab_start, vocab_start + numel / hidden_size): a vocabulary shard, or all of it at 0. The
// backward takes the tokens' index (index_tokens above, made on the host when the tokens are
// uploaded) in place of the tokens; its table gradients are fp32 on a GPU.
// embedding_at_positions_forward is incremental decoding's: N rows at positions of their own,
// the whole vocabulary.
namespace backend::ops {

void embedding_forward(Device& device, View output, View tokens, View word_embeddings,
                       View position_embeddings, int64_t batch_size, int64_t seq_length,
                       int64_t hidden_size, int64_t vocab_start);
void embedding_backward(Device& device, View dword_embeddings, View dposition_embeddings,
                        View doutput, View token_index, int64_t batch_size, int64_t seq_length,
                        int64_t hidden_size, int64_t vocab_start);
void embedding_at_positions_forward(Device& device, View output, View tokens, View positions,
                                    View word_embeddings, View position_embeddings, int64_t rows,
                                    int64_t hidden_size);

}  // namespace backend::ops
