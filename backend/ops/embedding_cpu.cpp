// CPU twin of embedding.hpp: word + position lookup and its scatter-add backward (from the
// tokens' index: one owner per row and column range), over the word table's vocabulary shard
// [vocab_start, vocab_start + V).
#include "backend/ops/embedding.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {
namespace {

// The token's row in this shard's word table, or −1 when the shard does not hold it.
int64_t shard_row(int32_t token, int64_t vocab_start, int64_t vocab_size) {
  const int64_t row = int64_t{token} - vocab_start;
  return row >= 0 && row < vocab_size ? row : -1;
}

}  // namespace

template <typename Scalar>
void embedding_forward(Scalar* output, const int32_t* tokens, const Scalar* word_embeddings,
                       const Scalar* position_embeddings, int64_t batch_size, int64_t seq_length,
                       int64_t hidden_size, int64_t vocab_start, int64_t vocab_size) {
  const int64_t rows = batch_size * seq_length;
#pragma omp parallel for if (rows * hidden_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t word_row = shard_row(tokens[row], vocab_start, vocab_size);
    Scalar* out = output + row * hidden_size;
    const Scalar* position = position_embeddings == nullptr
                                 ? nullptr
                                 : position_embeddings + (row % seq_length) * hidden_size;
    if (word_row < 0) {  // another shard's token: the position row alone (or 0)
      for (int64_t c = 0; c < hidden_size; ++c) {
        out[c] = position != nullptr ? position[c] : Scalar{0};
      }
      continue;
    }
    const Scalar* word = word_embeddings + word_row * hidden_size;
    if (position == nullptr) {
      for (int64_t c = 0; c < hidden_size; ++c) out[c] = word[c];
      continue;
    }
    for (int64_t c = 0; c < hidden_size; ++c) out[c] = word[c] + position[c];
  }
}

template <typename Scalar>
void embedding_backward(Scalar* dword_embeddings, Scalar* dposition_embeddings,
                        const Scalar* doutput, const int32_t* token_index, int64_t batch_size,
                        int64_t seq_length, int64_t hidden_size, int64_t vocab_start,
                        int64_t vocab_size) {
  const int64_t rows = batch_size * seq_length;
  const bool parallel = rows * hidden_size > detail::kParallelWork;

  // Each distinct token's row has one owner per column range, which sums the token's positions
  // in kEmbeddingGradientGroups' order (embedding.hpp's index).
  const TokenIndexLayout layout = token_index_layout(rows);
  const int64_t unique = token_index[0];
  const int32_t* order = token_index + layout.order;
  const int32_t* segment_starts = token_index + layout.segment_starts;
  const int32_t* unique_tokens = token_index + layout.unique_tokens;
  const int64_t chunks = detail::column_chunks(hidden_size);
#pragma omp parallel for schedule(dynamic, 32) if (parallel)  // rows differ in length
  for (int64_t work = 0; work < unique * chunks; ++work) {
    const int64_t u = work / chunks;
    const int64_t word_row = shard_row(unique_tokens[u], vocab_start, vocab_size);
    if (word_row < 0) continue;  // another shard's row gets this gradient
    const auto [begin, end] = detail::column_range(work % chunks, hidden_size);
    Scalar* dword = dword_embeddings + word_row * hidden_size;
    constexpr int kGroups = kEmbeddingGradientGroups;
    Scalar partial[kGroups][detail::kColumnChunk] = {};
    const int32_t first = segment_starts[u];
    for (int32_t k = first; k < segment_starts[u + 1]; ++k) {
      const Scalar* dout = doutput + int64_t{order[k]} * hidden_size;
      Scalar* sum = partial[(k - first) % kGroups];
      for (int64_t c = begin; c < end; ++c) sum[c - begin] += dout[c];
    }
    for (int64_t c = begin; c < end; ++c) {
      Scalar total = 0;
      for (int g = 0; g < kGroups; ++g) total += partial[g][c - begin];
      dword[c] += total;
    }
  }

  if (dposition_embeddings == nullptr) return;
#pragma omp parallel for if (parallel)
  for (int64_t t = 0; t < seq_length; ++t) {
    Scalar* dposition = dposition_embeddings + t * hidden_size;
    for (int64_t c = 0; c < hidden_size; ++c) {
      Scalar sum = 0;
      for (int64_t b = 0; b < batch_size; ++b)
        sum += doutput[(b * seq_length + t) * hidden_size + c];
      dposition[c] += sum;
    }
  }
}

template <typename Scalar>
void embedding_at_positions_forward(Scalar* output, const int32_t* tokens,
                                    const int32_t* positions, const Scalar* word_embeddings,
                                    const Scalar* position_embeddings, int64_t rows,
                                    int64_t hidden_size) {
#pragma omp parallel for if (rows * hidden_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    Scalar* out = output + row * hidden_size;
    const Scalar* word = word_embeddings + int64_t{tokens[row]} * hidden_size;
    if (position_embeddings == nullptr) {
      for (int64_t c = 0; c < hidden_size; ++c) out[c] = word[c];
      continue;
    }
    const Scalar* position = position_embeddings + int64_t{positions[row]} * hidden_size;
    for (int64_t c = 0; c < hidden_size; ++c) out[c] = word[c] + position[c];
  }
}

#define BACKEND_INSTANTIATE_EMBEDDING(Scalar)                                                    \
  template void embedding_forward<Scalar>(Scalar*, const int32_t*, const Scalar*, const Scalar*, \
                                          int64_t, int64_t, int64_t, int64_t, int64_t);          \
  template void embedding_backward<Scalar>(Scalar*, Scalar*, const Scalar*, const int32_t*,      \
                                           int64_t, int64_t, int64_t, int64_t, int64_t);        \
  template void embedding_at_positions_forward<Scalar>(Scalar*, const int32_t*, const int32_t*, \
                                                       const Scalar*, const Scalar*, int64_t,   \
                                                       int64_t);
BACKEND_INSTANTIATE_EMBEDDING(float)
BACKEND_INSTANTIATE_EMBEDDING(double)
#undef BACKEND_INSTANTIATE_EMBEDDING

}  // namespace backend::cpu
