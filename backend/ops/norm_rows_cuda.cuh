// The kernels of the two norms (layernorm_cuda.cu and rmsnorm_cuda.cu), written once over
// NormKind (norm_kind.hpp): LayerNorm centres the row (mean subtracted, the weight plus
// --apply-layernorm-1p's offset, a bias), RMSNorm does not (no mean, no bias). Each kind keeps
// its own expressions, in `if constexpr` branches, so each computes what its CPU twin
// (norm_rows_cpu.hpp) computes, in the same order. One block per row (16-byte packs along it
// where C and the pointers allow; cuda_common.cuh's row walk) with block_sum's fixed tree for
// the row sums; the parameter gradients' column sums as per-row-group partials in row order,
// added in group order by a second kernel (launch_column_sums): deterministic without atomics.
#pragma once

#include "backend/ops/cuda_common.cuh"
#include "backend/ops/norm_kind.hpp"

namespace backend::cuda::detail {

// A twin's ResidualAdd with the kernels' element type.
template <typename Scalar>
ResidualAdd<DeviceElementOf<Scalar>> device_residual(ResidualAdd<Scalar> residual) {
  return {device_pointer(residual.sum), device_pointer(residual.residual),
          device_pointer(residual.branch)};
}

// output = norm(input) per row, and the row's statistics: mean (LayerNorm only; nullptr for
// RMSNorm) and rstd = 1 / sqrt(Σ (x − mean)² / C + ε), with mean 0 for RMSNorm. Two passes for
// LayerNorm (mean, then squared deviations, as the CPU: E[x²] − E[x]² cancels in float).
// With residual.sum set, the row's sum = residual + branch (added in float, rounded once to T,
// as residual_cuda.cu) is written first, by the thread that reads it back in every pass (the
// same channels each pass), and normalised: input is sum.
template <NormKind kKind, typename T, int Width>
__global__ void norm_forward_kernel(T* output, float* mean, float* rstd, const T* input,
                                    const T* weight, const T* bias, float weight_offset,
                                    float epsilon, int64_t rows, int64_t channels,
                                    ResidualAdd<T> residual) {
  constexpr bool kCentered = kKind == NormKind::layer_norm;
  __shared__ float shared[32];
  for_each_row(rows, [&](int64_t row) {
    if (residual.sum != nullptr) {
      const int64_t first = row * channels;
      for_each_pack_of_row<Width>(channels, [&](int64_t c) {
        float rs[Width];
        float bs[Width];
        load_floats(rs, residual.residual + first + c);
        load_floats(bs, residual.branch + first + c);
#pragma unroll
        for (int j = 0; j < Width; ++j) rs[j] += bs[j];
        store_floats(residual.sum + first + c, rs);
      });
    }
    const T* x = input + row * channels;
    T* y = output + row * channels;
    float row_mean = 0.0f;
    if constexpr (kCentered) {
      float sum = 0.0f;
      for_each_pack_of_row<Width>(channels, [&](int64_t c) {
        float xs[Width];
        load_floats(xs, x + c);
#pragma unroll
        for (int j = 0; j < Width; ++j) sum += xs[j];
      });
      row_mean = block_sum(sum, shared) / static_cast<float>(channels);
    }
    float squares = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      load_floats(xs, x + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        if constexpr (kCentered) {
          const float deviation = xs[j] - row_mean;
          squares += deviation * deviation;
        } else {
          squares += xs[j] * xs[j];
        }
      }
    });
    // 1 / sqrtf, not rsqrtf (an approximation): the CPU's correctly rounded quotient.
    const float row_rstd =
        1.0f / sqrtf(block_sum(squares, shared) / static_cast<float>(channels) + epsilon);
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      float xs[Width];
      float ws[Width];
      float ys[Width];
      load_floats(xs, x + c);
      load_floats(ws, weight + c);
      if constexpr (kCentered) {
        float bs[Width];
        load_floats(bs, bias + c);
#pragma unroll
        for (int j = 0; j < Width; ++j) {
          ys[j] = (xs[j] - row_mean) * row_rstd * (ws[j] + weight_offset) + bs[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < Width; ++j) ys[j] = xs[j] * row_rstd * ws[j];
      }
      store_floats(y + c, ys);
    });
    if (threadIdx.x == 0) {
      if constexpr (kCentered) mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
  });
}

// dinput = rstd · (g − mean(g) − x̂ · mean(g · x̂)) with g = dy · w (LayerNorm), or
// rstd · (g − x̂ · mean(g · x̂)) (RMSNorm), one block per row, Width as the forward; with
// `accumulate`, added to dinput in float and rounded once. Each thread reads dy and x at its
// channels before writing dx there, and the sums complete (block_sum's barriers) before any
// write, so dinput may alias doutput when it is overwritten.
template <NormKind kKind, typename T, int Width>
__global__ void norm_dinput_kernel(T* dinput, const T* doutput, const T* input, const T* weight,
                                   float weight_offset, const float* mean, const float* rstd,
                                   int64_t rows, int64_t channels, bool accumulate) {
  constexpr bool kCentered = kKind == NormKind::layer_norm;
  __shared__ float shared[32];
  const float inverse_channels = 1.0f / static_cast<float>(channels);
  for_each_row(rows, [&](int64_t row) {
    const T* x = input + row * channels;
    const T* dy = doutput + row * channels;
    T* dx = dinput + row * channels;
    float row_mean = 0.0f;
    if constexpr (kCentered) row_mean = mean[row];
    const float row_rstd = rstd[row];
    // The packs of x, dy and the weight at channel c, for both passes.
    struct Packs {
      float x[Width];
      float dy[Width];
      float w[Width];
    };
    auto load = [&](int64_t c) {
      Packs packs;
      load_floats(packs.x, x + c);
      load_floats(packs.dy, dy + c);
      load_floats(packs.w, weight + c);
      return packs;
    };
    [[maybe_unused]] float sum_g = 0.0f;  // LayerNorm's
    float sum_g_xhat = 0.0f;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      const Packs p = load(c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        if constexpr (kCentered) {
          const float g = p.dy[j] * (p.w[j] + weight_offset);
          sum_g += g;
          sum_g_xhat += g * (p.x[j] - row_mean) * row_rstd;
        } else {
          sum_g_xhat += p.dy[j] * p.w[j] * p.x[j] * row_rstd;
        }
      }
    });
    float mean_g = 0.0f;
    if constexpr (kCentered) mean_g = block_sum(sum_g, shared) * inverse_channels;
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) * inverse_channels;
    for_each_pack_of_row<Width>(channels, [&](int64_t c) {
      const Packs p = load(c);
      float dxs[Width];
      float previous[Width] = {};
      if (accumulate) load_floats(previous, dx + c);
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        if constexpr (kCentered) {
          const float xhat = (p.x[j] - row_mean) * row_rstd;
          dxs[j] = row_rstd * (p.dy[j] * (p.w[j] + weight_offset) - mean_g - xhat * mean_g_xhat);
        } else {
          dxs[j] = row_rstd * (p.dy[j] * p.w[j] - p.x[j] * row_rstd * mean_g_xhat);
        }
        if (accumulate) dxs[j] += previous[j];
      }
      store_floats(dx + c, dxs);
    });
  });
}

// The parameter gradients' column terms: dy · x̂ (dweight) and, for LayerNorm, dy (dbias).
template <NormKind kKind, typename T>
struct NormParameterTerms {
  static constexpr int kSums = kKind == NormKind::layer_norm ? 2 : 1;
  const T* doutput;
  const T* input;
  const float* mean;  // LayerNorm's
  const float* rstd;
  int64_t channels;
  __device__ void add(int64_t row, int64_t c, float (&sums)[kSums]) const {
    const float dy = to_float(doutput[row * channels + c]);
    if constexpr (kKind == NormKind::layer_norm) {
      sums[0] += dy * (to_float(input[row * channels + c]) - mean[row]) * rstd[row];
      sums[1] += dy;
    } else {
      sums[0] += dy * to_float(input[row * channels + c]) * rstd[row];
    }
  }
};

// The launches: the forward over rows × channels (mean and bias nullptr for RMSNorm), and the
// backward: the parameter gradients' column sums first (dbias nullptr for RMSNorm), since they
// read doutput, which dinput may overwrite, then dinput. Nothing for an empty tensor.
template <NormKind kKind, typename T>
void launch_norm_forward(T* output, float* mean, float* rstd, const T* input, const T* weight,
                         const T* bias, float weight_offset, float epsilon, int64_t rows,
                         int64_t channels, cudaStream_t stream, ResidualAdd<T> residual = {}) {
  if (rows <= 0 || channels <= 0) return;
  launch_with_pack_width<T>(
      channels, {output, input, weight, bias, residual.sum, residual.residual, residual.branch},
      [&](auto width) {
        norm_forward_kernel<kKind, T, decltype(width)::value>
            <<<row_grid(rows), kBlockSize, 0, stream>>>(output, mean, rstd, input, weight, bias,
                                                        weight_offset, epsilon, rows, channels,
                                                        residual);
      });
}

template <NormKind kKind, typename T>
void launch_norm_backward(T* dinput, float* dweight, float* dbias, const T* doutput, const T* input,
                          const T* weight, float weight_offset, const float* mean,
                          const float* rstd, int64_t rows, int64_t channels, float* scratch,
                          cudaStream_t stream, InputGradient mode = InputGradient::overwrite) {
  if (rows <= 0 || channels <= 0) return;
  using Terms = NormParameterTerms<kKind, T>;
  ColumnTargets<Terms::kSums> targets{};
  targets.columns[0] = dweight;
  if constexpr (Terms::kSums == 2) targets.columns[1] = dbias;
  launch_column_sums(targets, Terms{doutput, input, mean, rstd, channels}, scratch, rows, channels,
                     stream);
  launch_with_pack_width<T>(channels, {dinput, doutput, input, weight}, [&](auto width) {
    norm_dinput_kernel<kKind, T, decltype(width)::value><<<row_grid(rows), kBlockSize, 0, stream>>>(
        dinput, doutput, input, weight, weight_offset, mean, rstd, rows, channels,
        mode == InputGradient::accumulate);
  });
}

}  // namespace backend::cuda::detail
