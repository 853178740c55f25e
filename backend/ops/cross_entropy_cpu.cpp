// CPU twin of cross_entropy.hpp: one row of the vocabulary per OpenMP iteration.
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

}  // namespace

template <typename Scalar>
void cross_entropy_forward(Scalar* losses, Scalar* logsumexp, const Scalar* logits,
                           const int32_t* labels, int64_t rows, int64_t vocab_size) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* z = logits + row * vocab_size;
    Scalar row_logsumexp;
    if constexpr (std::is_same_v<Scalar, float>) {
      row_logsumexp = row_logsumexp_float(z, vocab_size);
    } else {
      const Scalar row_max = *std::max_element(z, z + vocab_size);
      Scalar sum = 0;
      for (int64_t v = 0; v < vocab_size; ++v) sum += std::exp(z[v] - row_max);
      row_logsumexp = row_max + std::log(sum);
    }
    logsumexp[row] = row_logsumexp;
    losses[row] = row_logsumexp - z[labels[row]];
  }
}

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits, const Scalar* logits, const Scalar* logsumexp,
                            const int32_t* labels, Scalar scale, int64_t rows, int64_t vocab_size) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* z = logits + row * vocab_size;
    Scalar* dz = dlogits + row * vocab_size;
    const Scalar row_logsumexp = logsumexp[row];
    if constexpr (std::is_same_v<Scalar, float>) {
#pragma omp simd
      for (int64_t v = 0; v < vocab_size; ++v) {
        dz[v] = detail::fast_exp(z[v] - row_logsumexp) * scale;
      }
    } else {
      for (int64_t v = 0; v < vocab_size; ++v) dz[v] = std::exp(z[v] - row_logsumexp) * scale;
    }
    dz[labels[row]] -= scale;
  }
}

#define BACKEND_INSTANTIATE_CROSS_ENTROPY(Scalar)                                              \
  template void cross_entropy_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const int32_t*, \
                                              int64_t, int64_t);                               \
  template void cross_entropy_backward<Scalar>(Scalar*, const Scalar*, const Scalar*,          \
                                               const int32_t*, Scalar, int64_t, int64_t);
BACKEND_INSTANTIATE_CROSS_ENTROPY(float)
BACKEND_INSTANTIATE_CROSS_ENTROPY(double)
#undef BACKEND_INSTANTIATE_CROSS_ENTROPY

}  // namespace backend::cpu
