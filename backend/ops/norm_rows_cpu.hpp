// The CPU twins of the two norms (layernorm_cpu.cpp, rmsnorm_cpu.cpp), written once over
// NormKind (norm_kind.hpp), each kind keeping its own expressions in `if constexpr` branches:
//   LayerNorm  mean = Σ x / C, rstd = 1 / sqrt(Σ (x − mean)² / C + ε), y = x̂ · (w + offset) + b,
//              dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · (w + offset)
//   RMSNorm    rstd = 1 / sqrt(Σ x² / C + ε), y = x̂ · w, dx = rstd · (g − x̂ · mean(g · x̂))
// with x̂ = (x − mean) · rstd (x · rstd for RMSNorm), x optionally the residual connection's
// sum written first, and dx optionally added to dinput (norm_kind.hpp's ResidualAdd and
// InputGradient; each row reads and writes only its own elements, so a row's sum is in the
// same thread's cache when normalised). One row per iteration for the forward and
// dinput; the sums along a row are detail::lane_sum's (16 partial sums in a fixed order,
// vector_math_cpu.hpp: one running sum was a chain of dependent additions, and the forward
// took 1.1 ms per 126M norm call for 0.8M elements); the weight and bias sums are column chunks
// (detail::add_column_sums), so no result depends on the thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/norm_kind.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu::detail {

// mean is written for LayerNorm only (nullptr for RMSNorm), bias read for LayerNorm only.
// With `residual` active, each row's sum = residual + branch is written first and normalised.
template <NormKind kKind, typename Scalar>
void norm_forward(Scalar* output, Scalar* mean, Scalar* rstd, const Scalar* input,
                  const Scalar* weight, const Scalar* bias, Scalar weight_offset, Scalar epsilon,
                  int64_t rows, int64_t channels, ResidualAdd<Scalar> residual = {}) {
  constexpr bool kCentered = kKind == NormKind::layer_norm;
#pragma omp parallel for if (rows * channels > kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    if (residual.active()) {
      const int64_t first = row * channels;
      for (int64_t c = 0; c < channels; ++c) {
        residual.sum[first + c] = residual.residual[first + c] + residual.branch[first + c];
      }
    }
    const Scalar* x = input + row * channels;
    Scalar* y = output + row * channels;
    // Two passes for LayerNorm (mean, then squared deviations) rather than E[x²] − E[x]²,
    // which cancels badly in float when |mean| ≫ std.
    Scalar row_mean = 0;
    if constexpr (kCentered) {
      const Scalar sum = lane_sum<Scalar>(channels, [x](int64_t c) { return x[c]; });
      row_mean = sum / static_cast<Scalar>(channels);
    }
    Scalar squares = 0;
    if constexpr (kCentered) {
      squares = lane_sum<Scalar>(channels, [x, row_mean](int64_t c) {
        const Scalar deviation = x[c] - row_mean;
        return deviation * deviation;
      });
    } else {
      squares = lane_sum<Scalar>(channels, [x](int64_t c) { return x[c] * x[c]; });
    }
    const Scalar row_rstd =
        Scalar{1} / std::sqrt(squares / static_cast<Scalar>(channels) + epsilon);
    for (int64_t c = 0; c < channels; ++c) {
      if constexpr (kCentered) {
        y[c] = (x[c] - row_mean) * row_rstd * (weight[c] + weight_offset) + bias[c];
      } else {
        y[c] = x[c] * row_rstd * weight[c];
      }
    }
    if constexpr (kCentered) mean[row] = row_mean;
    rstd[row] = row_rstd;
  }
}

// dinput (overwritten or added to, `mode`), and dweight (and LayerNorm's dbias, nullptr for
// RMSNorm) accumulated.
template <NormKind kKind, typename Scalar>
void norm_backward(Scalar* dinput, Scalar* dweight, Scalar* dbias, const Scalar* doutput,
                   const Scalar* input, const Scalar* weight, Scalar weight_offset,
                   const Scalar* mean, const Scalar* rstd, int64_t rows, int64_t channels,
                   InputGradient mode = InputGradient::overwrite) {
  constexpr bool kCentered = kKind == NormKind::layer_norm;
  const bool accumulate = mode == InputGradient::accumulate;
  const bool parallel = rows * channels > kParallelWork;
  const Scalar inverse_channels = Scalar{1} / static_cast<Scalar>(channels);

#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* x = input + row * channels;
    const Scalar* dy = doutput + row * channels;
    Scalar* dx = dinput + row * channels;
    const Scalar row_rstd = rstd[row];
    Scalar row_mean = 0, mean_g = 0, mean_g_xhat = 0;
    if constexpr (kCentered) {
      row_mean = mean[row];
      mean_g = lane_sum<Scalar>(channels,
                                [dy, weight, weight_offset](int64_t c) {
                                  return dy[c] * (weight[c] + weight_offset);
                                }) *
               inverse_channels;
      mean_g_xhat = lane_sum<Scalar>(channels,
                                     [dy, weight, weight_offset, x, row_mean, row_rstd](int64_t c) {
                                       return dy[c] * (weight[c] + weight_offset) *
                                              (x[c] - row_mean) * row_rstd;
                                     }) *
                    inverse_channels;
    } else {
      mean_g_xhat = lane_sum<Scalar>(channels,
                                     [dy, weight, x, row_rstd](int64_t c) {
                                       return dy[c] * weight[c] * x[c] * row_rstd;
                                     }) *
                    inverse_channels;
    }
    // Channels [begin, end) of the row's gradient into out[0, end − begin).
    const auto gradient = [&](int64_t begin, int64_t end, Scalar* out) {
      for (int64_t c = begin; c < end; ++c) {
        if constexpr (kCentered) {
          const Scalar xhat = (x[c] - row_mean) * row_rstd;
          out[c - begin] =
              row_rstd * (dy[c] * (weight[c] + weight_offset) - mean_g - xhat * mean_g_xhat);
        } else {
          out[c - begin] = row_rstd * (dy[c] * weight[c] - x[c] * row_rstd * mean_g_xhat);
        }
      }
    };
    if (!accumulate) {
      gradient(0, channels, dx);
      continue;
    }
    // Added to dinput, the gradient is written to a block of its own first and then added:
    // rounded as the separate ops (norm, then residual) round it, since the compiler may not
    // fuse the last product with the addition into one multiply-add through memory; so the
    // fused backward has their bits, and allocates nothing.
    constexpr int64_t kBlock = 64;
    std::array<Scalar, kBlock> block;
    for (int64_t begin = 0; begin < channels; begin += kBlock) {
      const int64_t end = std::min(channels, begin + kBlock);
      gradient(begin, end, block.data());
      for (int64_t c = begin; c < end; ++c) dx[c] += block[static_cast<size_t>(c - begin)];
    }
  }

  const auto add_row = [&](int64_t row, int64_t begin, int64_t end, auto& sums) {
    const Scalar* x = input + row * channels;
    const Scalar* dy = doutput + row * channels;
    for (int64_t c = begin; c < end; ++c) {
      if constexpr (kCentered) {
        sums[0][c - begin] += dy[c] * (x[c] - mean[row]) * rstd[row];
        sums[1][c - begin] += dy[c];
      } else {
        sums[0][c - begin] += dy[c] * x[c] * rstd[row];
      }
    }
  };
  if constexpr (kCentered) {
    add_column_sums<2>(std::array{dweight, dbias}, rows, channels, parallel, add_row);
  } else {
    add_column_sums<1>(std::array{dweight}, rows, channels, parallel, add_row);
  }
}

}  // namespace backend::cpu::detail
