// Causal grouped-query attention in fp64, straight from the formulas (O(T²) per head), for the
// checks of the kernels that cannot be compared with the CPU twin element for element: the
// tensor-core kernels under warp emulation (tests/gpu/emulation/) and cuDNN's attention with its
// own dropout mask (tests/gpu/attention_test.cpp). Per (batch, head) pair, with the qkv row in
// Megatron core's grouped layout (backend/ops/attention.hpp) and M the dropout multipliers:
//   P = softmax(Q·Kᵀ·scale) (causal), logsumexp the natural log of its normaliser,
//   O = (P ∘ M) · V,  dV = (P ∘ M)ᵀ · dO,  dS = P ∘ (dO·Vᵀ ∘ M − rowsum(dO ∘ O)) · scale,
//   dQ = dS · K,  dK = dSᵀ · Q.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace gpu_test {

struct AttentionDims {
  int64_t batch, seq, heads, groups, head_dim;
};

struct AttentionReference {
  std::vector<double> output, logsumexp, dqkv;  // (B, T, NH·HD), (B, NH, T), (B, T, W)
};

// multiplier(pair, i, j): element (i, j) of pair b·NH + h's dropout multiplier, keep ? 1/(1 − p)
// : 0 (1 without dropout).
using DropoutMultiplier = std::function<double(int64_t pair, int64_t i, int64_t j)>;

inline AttentionReference attention_reference(const AttentionDims& s, const std::vector<float>& qkv,
                                              const std::vector<float>& dout,
                                              const DropoutMultiplier& multiplier) {
  const int64_t T = s.seq, HD = s.head_dim, per_group = s.heads / s.groups;
  const int64_t width = (s.heads + 2 * s.groups) * HD, hidden = s.heads * HD;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  auto query_col = [&](int64_t h) {
    return (h / per_group) * (per_group + 2) * HD + (h % per_group) * HD;
  };
  auto key_col = [&](int64_t g) { return g * (per_group + 2) * HD + per_group * HD; };
  AttentionReference r{std::vector<double>(static_cast<size_t>(s.batch * T * hidden)),
                       std::vector<double>(static_cast<size_t>(s.batch * s.heads * T)),
                       std::vector<double>(static_cast<size_t>(s.batch * T * width), 0.0)};
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t pair = b * s.heads + h, g = h / per_group;
      auto at = [&](int64_t row, int64_t column) {
        return static_cast<double>(qkv[static_cast<size_t>((b * T + row) * width + column)]);
      };
      auto q = [&](int64_t i, int64_t d) { return at(i, query_col(h) + d); };
      auto k = [&](int64_t j, int64_t d) { return at(j, key_col(g) + d); };
      auto v = [&](int64_t j, int64_t d) { return at(j, key_col(g) + HD + d); };
      auto dO = [&](int64_t i, int64_t d) {
        return static_cast<double>(dout[static_cast<size_t>((b * T + i) * hidden + h * HD + d)]);
      };
      auto out = [&](int64_t i, int64_t d) -> double& {
        return r.output[static_cast<size_t>((b * T + i) * hidden + h * HD + d)];
      };
      auto grad = [&](int64_t row, int64_t column) -> double& {
        return r.dqkv[static_cast<size_t>((b * T + row) * width + column)];
      };
      std::vector<double> P(static_cast<size_t>(T * T), 0.0), M(static_cast<size_t>(T * T), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> score(static_cast<size_t>(i + 1));
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < HD; ++d) dot += q(i, d) * k(j, d);
          score[static_cast<size_t>(j)] = dot * scale;
          max = std::max(max, dot * scale);
        }
        double sum = 0;
        for (double x : score) sum += std::exp(x - max);
        r.logsumexp[static_cast<size_t>(pair * T + i)] = max + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          P[static_cast<size_t>(i * T + j)] = std::exp(score[static_cast<size_t>(j)] - max) / sum;
          M[static_cast<size_t>(i * T + j)] = multiplier(pair, i, j);
        }
        for (int64_t d = 0; d < HD; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) {
            o += P[static_cast<size_t>(i * T + j)] * M[static_cast<size_t>(i * T + j)] * v(j, d);
          }
          out(i, d) = o;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        double delta = 0;
        for (int64_t d = 0; d < HD; ++d) delta += dO(i, d) * out(i, d);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[static_cast<size_t>(i * T + j)],
                       mask = M[static_cast<size_t>(i * T + j)];
          double dp = 0;
          for (int64_t d = 0; d < HD; ++d) dp += dO(i, d) * v(j, d);
          const double dscore = p * (dp * mask - delta);
          for (int64_t d = 0; d < HD; ++d) {
            grad(i, query_col(h) + d) += scale * dscore * k(j, d);
            grad(j, key_col(g) + d) += scale * dscore * q(i, d);
            grad(j, key_col(g) + HD + d) += p * mask * dO(i, d);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace gpu_test
