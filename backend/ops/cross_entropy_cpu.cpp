// CPU twin of cross_entropy.hpp: one row of the vocabulary per OpenMP iteration.
#include <algorithm>
#include <cmath>

#include "backend/ops/cross_entropy.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {

template <typename Scalar>
void cross_entropy_forward(Scalar* losses, Scalar* logsumexp, const Scalar* logits,
                           const int32_t* labels, int64_t rows, int64_t vocab_size) {
#pragma omp parallel for if (rows * vocab_size > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* z = logits + row * vocab_size;
    const Scalar row_max = *std::max_element(z, z + vocab_size);
    Scalar sum = 0;
    for (int64_t v = 0; v < vocab_size; ++v) sum += std::exp(z[v] - row_max);
    const Scalar row_logsumexp = row_max + std::log(sum);
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
    for (int64_t v = 0; v < vocab_size; ++v) dz[v] = std::exp(z[v] - row_logsumexp) * scale;
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
