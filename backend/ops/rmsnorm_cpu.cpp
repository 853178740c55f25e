// CPU twin of rmsnorm.hpp: one row per iteration for the forward and dinput, column chunks
// for the weight sums, detail::lane_sum along a row (as layernorm_cpu.cpp).
#include <cmath>

#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu {

template <typename Scalar>
void rmsnorm_forward(Scalar* output, Scalar* rstd, const Scalar* input, const Scalar* weight,
                     Scalar epsilon, int64_t rows, int64_t channels) {
#pragma omp parallel for if (rows * channels > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* x = input + row * channels;
    Scalar* y = output + row * channels;
    const Scalar squares =
        detail::lane_sum<Scalar>(channels, [x](int64_t c) { return x[c] * x[c]; });
    const Scalar row_rstd =
        Scalar{1} / std::sqrt(squares / static_cast<Scalar>(channels) + epsilon);
    for (int64_t c = 0; c < channels; ++c) y[c] = x[c] * row_rstd * weight[c];
    rstd[row] = row_rstd;
  }
}

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput, Scalar* dweight, const Scalar* doutput, const Scalar* input,
                      const Scalar* weight, const Scalar* rstd, int64_t rows, int64_t channels) {
  const bool parallel = rows * channels > detail::kParallelWork;
  const Scalar inverse_channels = Scalar{1} / static_cast<Scalar>(channels);

#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* x = input + row * channels;
    const Scalar* dy = doutput + row * channels;
    Scalar* dx = dinput + row * channels;
    const Scalar row_rstd = rstd[row];
    const Scalar mean_g_xhat =
        detail::lane_sum<Scalar>(channels,
                                 [dy, weight, x, row_rstd](int64_t c) {
                                   return dy[c] * weight[c] * x[c] * row_rstd;
                                 }) *
        inverse_channels;
    for (int64_t c = 0; c < channels; ++c) {
      dx[c] = row_rstd * (dy[c] * weight[c] - x[c] * row_rstd * mean_g_xhat);
    }
  }

  const int64_t chunks = detail::column_chunks(channels);
#pragma omp parallel for if (parallel)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const auto [begin, end] = detail::column_range(chunk, channels);
    Scalar weight_sums[detail::kColumnChunk] = {};
    for (int64_t row = 0; row < rows; ++row) {
      const Scalar* x = input + row * channels;
      const Scalar* dy = doutput + row * channels;
      for (int64_t c = begin; c < end; ++c) weight_sums[c - begin] += dy[c] * x[c] * rstd[row];
    }
    for (int64_t c = begin; c < end; ++c) dweight[c] += weight_sums[c - begin];
  }
}

#define BACKEND_INSTANTIATE_RMSNORM(Scalar)                                                     \
  template void rmsnorm_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*, Scalar, \
                                        int64_t, int64_t);                                      \
  template void rmsnorm_backward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*,        \
                                         const Scalar*, const Scalar*, int64_t, int64_t);
BACKEND_INSTANTIATE_RMSNORM(float)
BACKEND_INSTANTIATE_RMSNORM(double)
#undef BACKEND_INSTANTIATE_RMSNORM

}  // namespace backend::cpu
