// CPU twin of layernorm.hpp: one row per iteration for the forward and dinput, column
// chunks for the weight and bias sums. The sums along a row are detail::lane_sum's (16
// partial sums in a fixed order, vector_math_cpu.hpp): one running sum was a chain of
// dependent additions, and the forward took 1.1 ms per 126M norm call for 0.8M elements.
#include <cmath>

#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu {

template <typename Scalar>
void layernorm_forward(Scalar* output, Scalar* mean, Scalar* rstd, const Scalar* input,
                       const Scalar* weight, const Scalar* bias, Scalar weight_offset,
                       Scalar epsilon, int64_t rows, int64_t channels) {
#pragma omp parallel for if (rows * channels > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* x = input + row * channels;
    Scalar* y = output + row * channels;
    // Two passes (mean, then squared deviations) rather than E[x²] − E[x]², which cancels
    // badly in float when |mean| ≫ std.
    const Scalar sum = detail::lane_sum<Scalar>(channels, [x](int64_t c) { return x[c]; });
    const Scalar row_mean = sum / static_cast<Scalar>(channels);
    const Scalar squares = detail::lane_sum<Scalar>(channels, [x, row_mean](int64_t c) {
      const Scalar deviation = x[c] - row_mean;
      return deviation * deviation;
    });
    const Scalar row_rstd =
        Scalar{1} / std::sqrt(squares / static_cast<Scalar>(channels) + epsilon);
    for (int64_t c = 0; c < channels; ++c) {
      y[c] = (x[c] - row_mean) * row_rstd * (weight[c] + weight_offset) + bias[c];
    }
    mean[row] = row_mean;
    rstd[row] = row_rstd;
  }
}

template <typename Scalar>
void layernorm_backward(Scalar* dinput, Scalar* dweight, Scalar* dbias, const Scalar* doutput,
                        const Scalar* input, const Scalar* weight, Scalar weight_offset,
                        const Scalar* mean, const Scalar* rstd, int64_t rows, int64_t channels) {
  const bool parallel = rows * channels > detail::kParallelWork;
  const Scalar inverse_channels = Scalar{1} / static_cast<Scalar>(channels);

#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* x = input + row * channels;
    const Scalar* dy = doutput + row * channels;
    Scalar* dx = dinput + row * channels;
    const Scalar row_mean = mean[row];
    const Scalar row_rstd = rstd[row];
    const Scalar mean_g =
        detail::lane_sum<Scalar>(channels, [dy, weight, weight_offset](int64_t c) {
          return dy[c] * (weight[c] + weight_offset);
        }) * inverse_channels;
    const Scalar mean_g_xhat =
        detail::lane_sum<Scalar>(channels,
                                 [dy, weight, weight_offset, x, row_mean, row_rstd](int64_t c) {
                                   return dy[c] * (weight[c] + weight_offset) *
                                          (x[c] - row_mean) * row_rstd;
                                 }) *
        inverse_channels;
    for (int64_t c = 0; c < channels; ++c) {
      const Scalar xhat = (x[c] - row_mean) * row_rstd;
      dx[c] = row_rstd * (dy[c] * (weight[c] + weight_offset) - mean_g - xhat * mean_g_xhat);
    }
  }

  const int64_t chunks = detail::column_chunks(channels);
#pragma omp parallel for if (parallel)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const auto [begin, end] = detail::column_range(chunk, channels);
    Scalar weight_sums[detail::kColumnChunk] = {};
    Scalar bias_sums[detail::kColumnChunk] = {};
    for (int64_t row = 0; row < rows; ++row) {
      const Scalar* x = input + row * channels;
      const Scalar* dy = doutput + row * channels;
      for (int64_t c = begin; c < end; ++c) {
        weight_sums[c - begin] += dy[c] * (x[c] - mean[row]) * rstd[row];
        bias_sums[c - begin] += dy[c];
      }
    }
    for (int64_t c = begin; c < end; ++c) {
      dweight[c] += weight_sums[c - begin];
      dbias[c] += bias_sums[c - begin];
    }
  }
}

#define BACKEND_INSTANTIATE_LAYERNORM(Scalar)                                                      \
  template void layernorm_forward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*, const Scalar*, \
                                          const Scalar*, Scalar, Scalar, int64_t, int64_t);        \
  template void layernorm_backward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*,               \
                                           const Scalar*, const Scalar*, Scalar, const Scalar*,    \
                                           const Scalar*, int64_t, int64_t);
BACKEND_INSTANTIATE_LAYERNORM(float)
BACKEND_INSTANTIATE_LAYERNORM(double)
#undef BACKEND_INSTANTIATE_LAYERNORM

}  // namespace backend::cpu
