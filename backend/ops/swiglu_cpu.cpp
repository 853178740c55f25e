// CPU twin of swiglu.hpp: one row per iteration. In float the sigmoid's exponential is
// vector_math_cpu.hpp's fast_exp, so the loops vectorise (glibc's expf is a scalar call);
// double keeps std::exp.
#include <cmath>
#include <type_traits>

#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/swiglu.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu {
namespace {

template <typename Scalar>
Scalar sigmoid(Scalar x) {
  // For x → −∞, exp(−x) overflows to infinity and the quotient is 0, the limit.
  if constexpr (std::is_same_v<Scalar, float>) {
    return 1.0f / (1.0f + detail::fast_exp(-x));
  } else {
    return Scalar{1} / (Scalar{1} + std::exp(-x));
  }
}

}  // namespace

template <typename Scalar>
void swiglu_forward(Scalar* output, const Scalar* input, int64_t rows, int64_t features) {
#pragma omp parallel for if (rows * features > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* gate = input + row * 2 * features;
    const Scalar* linear = gate + features;
    Scalar* h = output + row * features;
    for (int64_t f = 0; f < features; ++f) h[f] = gate[f] * sigmoid(gate[f]) * linear[f];
  }
}

template <typename Scalar>
void swiglu_backward(Scalar* dinput, const Scalar* doutput, const Scalar* input, int64_t rows,
                     int64_t features) {
#pragma omp parallel for if (rows * features > detail::kParallelWork)
  for (int64_t row = 0; row < rows; ++row) {
    const Scalar* gate = input + row * 2 * features;
    const Scalar* linear = gate + features;
    const Scalar* dh = doutput + row * features;
    Scalar* dgate = dinput + row * 2 * features;
    Scalar* dlinear = dgate + features;
    for (int64_t f = 0; f < features; ++f) {
      const Scalar a = gate[f];
      const Scalar s = sigmoid(a);
      dgate[f] = dh[f] * linear[f] * s * (Scalar{1} + a * (Scalar{1} - s));
      dlinear[f] = dh[f] * a * s;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<double>(double*, const double*, int64_t, int64_t);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<double>(double*, const double*, const double*, int64_t, int64_t);

}  // namespace backend::cpu
