// CPU twin of attention.hpp. One (batch, head) pair per OpenMP iteration; inside it the three
// products are single-threaded OpenBLAS GEMMs on strided views of the qkv activation. The
// score GEMM computes the full T × T square and the softmax masks the upper triangle: for the
// sequence lengths of GPT pre-training the wasted half costs less than splitting the GEMM.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ops/attention.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {

using detail::Transpose;

template <typename Scalar>
void attention_forward(Scalar* output, Scalar* probabilities, const Scalar* qkv, int64_t batch_size,
                       int64_t seq_length, int64_t hidden_size, int64_t num_heads) {
  const int64_t T = seq_length;
  const int64_t head_dim = hidden_size / num_heads;
  const int64_t qkv_stride = 3 * hidden_size;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(head_dim));
  const int64_t pairs = batch_size * num_heads;

#pragma omp parallel for schedule(static) if (pairs * T * T * head_dim > detail::kParallelWork)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t b = pair / num_heads;
    const int64_t h = pair % num_heads;
    const Scalar* query = qkv + b * T * qkv_stride + h * 3 * head_dim;
    const Scalar* key = query + head_dim;
    const Scalar* value = query + 2 * head_dim;
    Scalar* probability = probabilities + pair * T * T;

    // S (T, T) = scale · Q (T, HD) · K^T (HD, T)
    detail::gemm(Transpose::no, Transpose::yes, T, T, head_dim, scale, query, qkv_stride, key,
                 qkv_stride, Scalar{0}, probability, T);
    for (int64_t i = 0; i < T; ++i) {
      Scalar* row = probability + i * T;
      const Scalar row_max = *std::max_element(row, row + i + 1);
      Scalar sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] - row_max);
        sum += row[j];
      }
      const Scalar inverse_sum = Scalar{1} / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inverse_sum;
      std::fill(row + i + 1, row + T, Scalar{0});
    }
    // O (T, HD) = P (T, T) · V (T, HD)
    detail::gemm(Transpose::no, Transpose::no, T, head_dim, T, Scalar{1}, probability, T, value,
                 qkv_stride, Scalar{0}, output + b * T * hidden_size + h * head_dim, hidden_size);
  }
}

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* doutput, const Scalar* qkv,
                        const Scalar* probabilities, int64_t batch_size, int64_t seq_length,
                        int64_t hidden_size, int64_t num_heads) {
  const int64_t T = seq_length;
  const int64_t head_dim = hidden_size / num_heads;
  const int64_t qkv_stride = 3 * hidden_size;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(head_dim));
  const int64_t pairs = batch_size * num_heads;

#pragma omp parallel if (pairs * T * T * head_dim > detail::kParallelWork)
  {
    std::vector<Scalar> dscores(static_cast<size_t>(T * T));  // dP, then dS, per thread
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t b = pair / num_heads;
      const int64_t h = pair % num_heads;
      const int64_t head_offset = b * T * qkv_stride + h * 3 * head_dim;
      const Scalar* query = qkv + head_offset;
      const Scalar* key = query + head_dim;
      const Scalar* value = query + 2 * head_dim;
      Scalar* dquery = dqkv + head_offset;
      Scalar* dkey = dquery + head_dim;
      Scalar* dvalue = dquery + 2 * head_dim;
      const Scalar* probability = probabilities + pair * T * T;
      const Scalar* dout = doutput + b * T * hidden_size + h * head_dim;

      // dV (T, HD) = P^T (T, T) · dO (T, HD)
      detail::gemm(Transpose::yes, Transpose::no, T, head_dim, T, Scalar{1}, probability, T, dout,
                   hidden_size, Scalar{0}, dvalue, qkv_stride);
      // dP (T, T) = dO (T, HD) · V^T (HD, T)
      detail::gemm(Transpose::no, Transpose::yes, T, T, head_dim, Scalar{1}, dout, hidden_size,
                   value, qkv_stride, Scalar{0}, dscores.data(), T);
      // Softmax backward, row by row; masked entries get zero gradient.
      for (int64_t i = 0; i < T; ++i) {
        const Scalar* p = probability + i * T;
        Scalar* ds = dscores.data() + i * T;
        Scalar dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += p[j] * ds[j];
        for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - dot);
        std::fill(ds + i + 1, ds + T, Scalar{0});
      }
      // dQ (T, HD) = scale · dS (T, T) · K (T, HD)
      detail::gemm(Transpose::no, Transpose::no, T, head_dim, T, scale, dscores.data(), T, key,
                   qkv_stride, Scalar{0}, dquery, qkv_stride);
      // dK (T, HD) = scale · dS^T (T, T) · Q (T, HD)
      detail::gemm(Transpose::yes, Transpose::no, T, head_dim, T, scale, dscores.data(), T, query,
                   qkv_stride, Scalar{0}, dkey, qkv_stride);
    }
  }
}

#define BACKEND_INSTANTIATE_ATTENTION(Scalar)                                                    \
  template void attention_forward<Scalar>(Scalar*, Scalar*, const Scalar*, int64_t, int64_t,     \
                                          int64_t, int64_t);                                     \
  template void attention_backward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*, \
                                           int64_t, int64_t, int64_t, int64_t);
BACKEND_INSTANTIATE_ATTENTION(float)
BACKEND_INSTANTIATE_ATTENTION(double)
#undef BACKEND_INSTANTIATE_ATTENTION

}  // namespace backend::cpu
