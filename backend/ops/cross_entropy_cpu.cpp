// CPU twin of cross_entropy.hpp: one row of the vocabulary per OpenMP iteration; the
// vocabulary-parallel partial takes the forward's row log-sum-exp (row_logsumexp), so one
// shard is the forward's bits, and the fused forward-backward is the forward's row then the
// backward's row: the separate ops' bits.
//
// The float path (training) takes the exponentials from vector_math_cpu.hpp's fast_exp, so
// the two passes over the (B·T, V) logits vectorise: at the 126M shape (1024 × 50304) glibc's
// scalar expf made the forward and backward cost as much as a small GEMM. The sum of the
// exponentials is detail::lane_sum's: 16 partial sums, element v into sum v mod 16, added in
// lane order at the end: a fixed order that depends on V alone (not on the thread count or
// the vector width), and shorter float sums than one running total. The row maximum is exact in
// any order. The double path (gradient checks) keeps std::exp and the running sum.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu {
namespace {

// log Σ_v exp(z[v]) of one row of float logits.
float row_logsumexp_float(const float* z, int64_t vocab_size) {
  float row_max = z[0];
#pragma omp simd reduction(max : row_max)
  for (int64_t v = 0; v < vocab_size; ++v) row_max = std::max(row_max, z[v]);
  const float sum = detail::lane_sum<float>(
      vocab_size, [z, row_max](int64_t v) { return detail::fast_exp(z[v] - row_max); });
  return row_max + std::log(sum);
}

// log Σ_v exp(z[v]) of one row (vocab_size ≥ 1): the float path above, or std::exp and a
// running sum in double.
template <typename Scalar>
Scalar row_logsumexp(const Scalar* z, int64_t vocab_size) {
  if constexpr (std::is_same_v<Scalar, float>) {
    return row_logsumexp_float(z, vocab_size);
  } else {
    const Scalar row_max = *std::max_element(z, z + vocab_size);
    Scalar sum = 0;
    for (int64_t v = 0; v < vocab_size; ++v) sum += std::exp(z[v] - row_max);
    return row_max + std::log(sum);
  }
}

// The label's column in a shard of vocab_size columns from vocab_start, or −1 off the shard.
int64_t shard_column(int32_t label, int64_t vocab_start, int64_t vocab_size) {
  const int64_t column = int64_t{label} - vocab_start;
  return column >= 0 && column < vocab_size ? column : -1;
}

// One row's forward: its log-sum-exp and loss.
template <typename Scalar>
void forward_row(Scalar& loss, Scalar& logsumexp, const Scalar* z, int32_t label,
                 int64_t vocab_size) {
  logsumexp = row_logsumexp(z, vocab_size);
  loss = label < 0 ? Scalar{0} : logsumexp - z[label];
}

// One row's gradient from its logits z (columns vocab_start + [0, V)) and the whole
// vocabulary's log-sum-exp; dz may be z (each entry is read before it is written).
template <typename Scalar>
void backward_row(Scalar* dz, const Scalar* z, Scalar row_logsumexp, int32_t label, Scalar scale,
                  int64_t vocab_size, int64_t vocab_start) {
  if (label < 0) {
    std::fill(dz, dz + vocab_size, Scalar{0});
    return;
  }
  if constexpr (std::is_same_v<Scalar, float>) {
#pragma omp simd
    for (int64_t v = 0; v < vocab_size; ++v) {
      dz[v] = detail::fast_exp(z[v] - row_logsumexp) * scale;
    }
  } else {
    for (int64_t v = 0; v < vocab_size; ++v) dz[v] = std::exp(z[v] - row_logsumexp) * scale;
  }
  // Only the shard that holds the label subtracts scale (others leave it to that one).
  const int64_t column = shard_column(label, vocab_start, vocab_size);
  if (column >= 0) dz[column] -= scale;
}

}  // namespace

template <typename Scalar>
void cross_entropy_forward(Scalar* losses, Scalar* logsumexp, const Scalar* logits,
                           const int32_t* labels, int64_t rows, int64_t vocab_size) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    forward_row(losses[row], logsumexp[row], logits + row * vocab_size, labels[row], vocab_size);
  }
}

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits, const Scalar* logits, const Scalar* logsumexp,
                            const int32_t* labels, Scalar scale, int64_t rows, int64_t vocab_size,
                            int64_t vocab_start) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    backward_row(dlogits + row * vocab_size, logits + row * vocab_size, logsumexp[row], labels[row],
                 scale, vocab_size, vocab_start);
  }
}

// Row by row, the forward's then the backward's code: the separate ops' bits, with the row
// still in cache for its second pass.
template <typename Scalar>
void cross_entropy_forward_backward(Scalar* losses, Scalar* logsumexp, Scalar* logits,
                                    const int32_t* labels, Scalar scale, int64_t rows,
                                    int64_t vocab_size) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    Scalar* z = logits + row * vocab_size;
    forward_row(losses[row], logsumexp[row], z, labels[row], vocab_size);
    backward_row(z, z, logsumexp[row], labels[row], scale, vocab_size, int64_t{0});
  }
}

template <typename Scalar>
void vocab_parallel_cross_entropy_partial(Scalar* logsumexp_part, Scalar* target_logit,
                                          const Scalar* logits, const int32_t* labels, int64_t rows,
                                          int64_t vocab_size, int64_t vocab_start) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* z = logits + row * vocab_size;
    // An empty shard sums nothing: log 0 = −∞, which the combine's exp turns back into 0.
    logsumexp_part[row] =
        vocab_size > 0 ? row_logsumexp(z, vocab_size) : -std::numeric_limits<Scalar>::infinity();
    const int64_t label = shard_column(labels[row], vocab_start, vocab_size);
    target_logit[row] = label >= 0 ? z[label] : Scalar{0};
  }
}

template <typename Scalar>
void vocab_parallel_cross_entropy_combine(Scalar* losses, Scalar* logsumexp,
                                          const Scalar* logsumexp_parts, const Scalar* target_logit,
                                          const int32_t* labels, int64_t rows, int64_t parts) {
  // std::exp and std::log even for float (parts is a handful): exp(0) = 1 and log 1 = 0
  // exactly, so one part passes through unchanged, which fast_exp does not promise.
#pragma omp parallel for if (rows * parts > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* part = logsumexp_parts + row;  // part[k * rows]: part k's value
    Scalar part_max = part[0];
    for (int64_t k = 1; k < parts; ++k) part_max = std::max(part_max, part[k * rows]);
    Scalar sum = 0;
    for (int64_t k = 0; k < parts; ++k) sum += std::exp(part[k * rows] - part_max);
    const Scalar row_lse = part_max + std::log(sum);
    logsumexp[row] = row_lse;
    losses[row] = labels[row] < 0 ? Scalar{0} : row_lse - target_logit[row];
  }
}

#define BACKEND_INSTANTIATE_CROSS_ENTROPY(Scalar)                                                  \
  template void cross_entropy_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const int32_t*,     \
                                              int64_t, int64_t);                                   \
  template void cross_entropy_backward<Scalar>(Scalar*, const Scalar*, const Scalar*,              \
                                               const int32_t*, Scalar, int64_t, int64_t, int64_t); \
  template void cross_entropy_forward_backward<Scalar>(Scalar*, Scalar*, Scalar*, const int32_t*,  \
                                                       Scalar, int64_t, int64_t);                  \
  template void vocab_parallel_cross_entropy_partial<Scalar>(                                      \
      Scalar*, Scalar*, const Scalar*, const int32_t*, int64_t, int64_t, int64_t);                 \
  template void vocab_parallel_cross_entropy_combine<Scalar>(                                      \
      Scalar*, Scalar*, const Scalar*, const Scalar*, const int32_t*, int64_t, int64_t);
BACKEND_INSTANTIATE_CROSS_ENTROPY(float)
BACKEND_INSTANTIATE_CROSS_ENTROPY(double)
#undef BACKEND_INSTANTIATE_CROSS_ENTROPY

}  // namespace backend::cpu
