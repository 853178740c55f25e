// CPU twin of attention.hpp. One (batch, head) pair per OpenMP iteration; inside it the three
// products are single-threaded OpenBLAS GEMMs on strided views of the qkv activation. The
// score GEMM computes the full T × T square and the softmax masks the upper triangle: for the
// sequence lengths of GPT pre-training the wasted half costs less than splitting the GEMM.
// With dropout, the dropped probabilities D of one pair go to a per-thread T × T scratch (the
// forward's and again the backward's: the mask is regenerated, never stored); without it the
// code is the dropout-free path, with no scratch and no generator call.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ops/attention.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {

using detail::Transpose;

namespace {

// The causal lower triangle of one pair's mask, applied: out[i, j] = in[i, j] · keep · scale
// for j ≤ i, 0 above the diagonal. `first` is the mask index of the pair's element (0, 0).
template <typename Scalar>
void apply_causal_dropout(Scalar* out, const Scalar* in, int64_t T, uint64_t first, uint64_t key,
                          uint64_t threshold, Scalar scale) {
  for (int64_t i = 0; i < T; ++i) {
    const uint64_t row = first + static_cast<uint64_t>(i * T);
    for (int64_t j = 0; j <= i; ++j) {
      out[i * T + j] =
          in[i * T + j] *
          (dropout_keep(key, row + static_cast<uint64_t>(j), threshold) ? scale : Scalar{0});
    }
    std::fill(out + i * T + i + 1, out + (i + 1) * T, Scalar{0});
  }
}

}  // namespace

template <typename Scalar>
void attention_forward(Scalar* output, Scalar* probabilities, const Scalar* qkv, int64_t batch_size,
                       int64_t seq_length, int64_t hidden_size, int64_t num_heads,
                       const Dropout& dropout) {
  const int64_t T = seq_length;
  const int64_t head_dim = hidden_size / num_heads;
  const int64_t qkv_stride = 3 * hidden_size;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(head_dim));
  const int64_t pairs = batch_size * num_heads;
  const bool drop = dropout.active();
  const uint64_t threshold = dropout.threshold();
  const Scalar dropout_scale = dropout.scale<Scalar>();

#pragma omp parallel if (pairs * T * T * head_dim > detail::kParallelWork)
  {
    std::vector<Scalar> dropped(drop ? static_cast<size_t>(T * T) : 0);  // D, per thread
#pragma omp for schedule(static)
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
      const Scalar* weights = probability;
      if (drop) {
        apply_causal_dropout(dropped.data(), probability, T, static_cast<uint64_t>(pair * T * T),
                             dropout.key, threshold, dropout_scale);
        weights = dropped.data();
      }
      // O (T, HD) = D (T, T) · V (T, HD)
      detail::gemm(Transpose::no, Transpose::no, T, head_dim, T, Scalar{1}, weights, T, value,
                   qkv_stride, Scalar{0}, output + b * T * hidden_size + h * head_dim, hidden_size);
    }
  }
}

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* doutput, const Scalar* qkv,
                        const Scalar* probabilities, int64_t batch_size, int64_t seq_length,
                        int64_t hidden_size, int64_t num_heads, const Dropout& dropout) {
  const int64_t T = seq_length;
  const int64_t head_dim = hidden_size / num_heads;
  const int64_t qkv_stride = 3 * hidden_size;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(head_dim));
  const int64_t pairs = batch_size * num_heads;
  const bool drop = dropout.active();
  const uint64_t threshold = dropout.threshold();
  const Scalar dropout_scale = dropout.scale<Scalar>();

#pragma omp parallel if (pairs * T * T * head_dim > detail::kParallelWork)
  {
    std::vector<Scalar> dscores(static_cast<size_t>(T * T));             // dP, then dS, per thread
    std::vector<Scalar> dropped(drop ? static_cast<size_t>(T * T) : 0);  // D, per thread
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
      const auto first = static_cast<uint64_t>(pair * T * T);

      const Scalar* weights = probability;
      if (drop) {
        apply_causal_dropout(dropped.data(), probability, T, first, dropout.key, threshold,
                             dropout_scale);
        weights = dropped.data();
      }
      // dV (T, HD) = D^T (T, T) · dO (T, HD)
      detail::gemm(Transpose::yes, Transpose::no, T, head_dim, T, Scalar{1}, weights, T, dout,
                   hidden_size, Scalar{0}, dvalue, qkv_stride);
      // dD (T, T) = dO (T, HD) · V^T (HD, T); with dropout, dP = dD · keep · scale
      detail::gemm(Transpose::no, Transpose::yes, T, T, head_dim, Scalar{1}, dout, hidden_size,
                   value, qkv_stride, Scalar{0}, dscores.data(), T);
      if (drop) {
        apply_causal_dropout(dscores.data(), dscores.data(), T, first, dropout.key, threshold,
                             dropout_scale);
      }
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
                                          int64_t, int64_t, const Dropout&);                     \
  template void attention_backward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*, \
                                           int64_t, int64_t, int64_t, int64_t, const Dropout&);
BACKEND_INSTANTIATE_ATTENTION(float)
BACKEND_INSTANTIATE_ATTENTION(double)
#undef BACKEND_INSTANTIATE_ATTENTION

}  // namespace backend::cpu
