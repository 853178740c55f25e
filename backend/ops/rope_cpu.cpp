// CPU twin of rope.hpp: one (batch, position) row per iteration; forward and backward are
// the same loop with the sign of sin θ flipped.
#include <cmath>

#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/rope.hpp"

namespace backend::cpu {
namespace {

// sign = +1 rotates by θ (forward), −1 by −θ (backward). Row r is at position positions[r], or
// at r mod T without positions (a batch of whole sequences).
template <typename Scalar>
void rotate(Scalar* output, const Scalar* input, const Scalar* cos, const Scalar* sin, Scalar sign,
            int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
            int64_t rotary_dim, int64_t row_stride, const int32_t* positions = nullptr) {
  const int64_t half = rotary_dim / 2;
  const int64_t rows = batch_size * seq_length;
#pragma omp parallel for if (rows * num_heads * head_dim > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t position = positions != nullptr ? int64_t{positions[row]} : row % seq_length;
    const Scalar* row_cos = cos + position * half;
    const Scalar* row_sin = sin + position * half;
    for (int64_t h = 0; h < num_heads; ++h) {
      const Scalar* x = input + row * row_stride + h * head_dim;
      Scalar* y = output + row * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const Scalar first = x[i];
        const Scalar second = x[i + half];
        const Scalar s = sign * row_sin[i];
        y[i] = first * row_cos[i] - second * s;
        y[i + half] = second * row_cos[i] + first * s;
      }
      if (y != x) {
        for (int64_t i = rotary_dim; i < head_dim; ++i) y[i] = x[i];
      }
    }
  }
}

}  // namespace

template <typename Scalar>
void rope_tables(Scalar* cos, Scalar* sin, int64_t seq_length, int64_t rotary_dim, double base,
                 RopeScaling scaling) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < seq_length; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double inverse_frequency = scaled_inverse_frequency(
          std::pow(base, -static_cast<double>(2 * i) / static_cast<double>(rotary_dim)), scaling);
      const double angle = static_cast<double>(t) * inverse_frequency;
      cos[t * half + i] = static_cast<Scalar>(std::cos(angle));
      sin[t * half + i] = static_cast<Scalar>(std::sin(angle));
    }
  }
}

template <typename Scalar>
void rope_forward(Scalar* output, const Scalar* input, const Scalar* cos, const Scalar* sin,
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride) {
  rotate(output, input, cos, sin, Scalar{1}, batch_size, seq_length, num_heads, head_dim,
         rotary_dim, row_stride);
}

template <typename Scalar>
void rope_backward(Scalar* dinput, const Scalar* doutput, const Scalar* cos, const Scalar* sin,
                   int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride) {
  rotate(dinput, doutput, cos, sin, Scalar{-1}, batch_size, seq_length, num_heads, head_dim,
         rotary_dim, row_stride);
}

template <typename Scalar>
void rope_at_positions_forward(Scalar* output, const Scalar* input, const Scalar* cos,
                               const Scalar* sin, const int32_t* positions, int64_t rows,
                               int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                               int64_t row_stride) {
  rotate(output, input, cos, sin, Scalar{1}, rows, 1, num_heads, head_dim, rotary_dim, row_stride,
         positions);
}

#define BACKEND_INSTANTIATE_ROPE(Scalar)                                                    \
  template void rope_tables<Scalar>(Scalar*, Scalar*, int64_t, int64_t, double, RopeScaling); \
  template void rope_forward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*,  \
                                     int64_t, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void rope_backward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*, \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void rope_at_positions_forward<Scalar>(Scalar*, const Scalar*, const Scalar*,    \
                                                  const Scalar*, const int32_t*, int64_t,   \
                                                  int64_t, int64_t, int64_t, int64_t);
BACKEND_INSTANTIATE_ROPE(float)
BACKEND_INSTANTIATE_ROPE(double)
#undef BACKEND_INSTANTIATE_ROPE

}  // namespace backend::cpu
