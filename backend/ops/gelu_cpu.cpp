// CPU twin of gelu.hpp.
#include <cmath>
#include <numbers>

#include "backend/ops/gelu.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {
namespace {

template <typename Scalar>
constexpr Scalar kSqrtTwoOverPi =
    static_cast<Scalar>(std::numbers::sqrt2* std::numbers::inv_sqrtpi);
template <typename Scalar>
constexpr Scalar kCubicCoefficient = static_cast<Scalar>(0.044715);

}  // namespace

template <typename Scalar>
void gelu_forward(Scalar* output, const Scalar* input, int64_t count) {
  constexpr Scalar s = kSqrtTwoOverPi<Scalar>;
  constexpr Scalar a = kCubicCoefficient<Scalar>;
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    const Scalar x = input[i];
    output[i] = Scalar{0.5} * x * (Scalar{1} + std::tanh(s * (x + a * x * x * x)));
  }
}

template <typename Scalar>
void gelu_backward(Scalar* dinput, const Scalar* doutput, const Scalar* input, int64_t count) {
  constexpr Scalar s = kSqrtTwoOverPi<Scalar>;
  constexpr Scalar a = kCubicCoefficient<Scalar>;
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    const Scalar x = input[i];
    const Scalar tanh_u = std::tanh(s * (x + a * x * x * x));
    const Scalar derivative =
        Scalar{0.5} * (Scalar{1} + tanh_u) +
        Scalar{0.5} * x * (Scalar{1} - tanh_u * tanh_u) * s * (Scalar{1} + Scalar{3} * a * x * x);
    dinput[i] = doutput[i] * derivative;
  }
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace backend::cpu
