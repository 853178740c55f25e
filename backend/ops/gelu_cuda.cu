// CUDA twin of gelu.hpp (CPU twin: gelu_cpu.cpp, its float path): GELU with the tanh
// approximation, written through 0.5 · (1 + tanh(u)) = σ(2u) = 1 / (1 + exp(−2u)):
//   u = sqrt(2/π) · x · (1 + 0.044715 · x²)
//   y = x / (1 + exp(−2u))
//   dy/dx = σ + x · 2σ(1 − σ) · sqrt(2/π) · (1 + 3 · 0.044715 · x²),  σ = σ(2u), 1 − σ = e · σ
// the better-conditioned form the CPU twin uses (no cancellation of 1 + tanh(u) for very
// negative x); expf is CUDA's accurate one (not __expf), so the two twins differ by a few ulp
// of their exponentials. Elementwise (detail::map_kernel), so deterministic; output may alias
// input and dinput may alias doutput.
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/gelu.hpp"

namespace backend::cuda {
namespace {

constexpr float kSqrtTwoOverPi = 0.7978845608028654f;  // sqrt(2/π)
constexpr float kCubicCoefficient = 0.044715f;

// exp(−2u) with −2u capped at `cap` (the backward keeps it below overflow).
__device__ __forceinline__ float exp_minus_two_u(float x, float cap) {
  const float u = kSqrtTwoOverPi * x * fmaf(kCubicCoefficient * x, x, 1.0f);
  const float argument = -2.0f * u;
  return expf(argument < cap ? argument : cap);
}

struct GeluForward {
  // For large negative x the exponential is +∞ and y = x / ∞ = −0, the limit.
  __device__ float operator()(float x, float, int64_t) const {
    return x / (1.0f + exp_minus_two_u(x, INFINITY));
  }
};

// a = doutput, b = input.
struct GeluBackward {
  __device__ float operator()(float dy, float x, int64_t) const {
    // e kept below exp(88) so that e · σ stays finite (1 − σ) rather than ∞ · 0; a NaN x still
    // gives NaN, x being a factor below.
    const float e = exp_minus_two_u(x, 88.0f);
    const float sigma = 1.0f / (1.0f + e);
    const float du_dx = kSqrtTwoOverPi * fmaf(3.0f * kCubicCoefficient * x, x, 1.0f);
    const float derivative = fmaf(x * (2.0f * sigma) * (e * sigma), du_dx, sigma);
    return dy * derivative;
  }
};

}  // namespace

template <typename Scalar>
void gelu_forward(Scalar* output, const Scalar* input, int64_t count, CudaStream stream) {
  const auto* x = detail::device_pointer(input);
  detail::launch_map(detail::device_pointer(output), x, x, count, GeluForward{}, stream);
}

template <typename Scalar>
void gelu_backward(Scalar* dinput, const Scalar* doutput, const Scalar* input, int64_t count,
                   CudaStream stream) {
  detail::launch_map(detail::device_pointer(dinput), detail::device_pointer(doutput),
                     detail::device_pointer(input), count, GeluBackward{}, stream);
}

template void gelu_forward<float>(float*, const float*, int64_t, CudaStream);
template void gelu_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t, CudaStream);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, CudaStream);
template void gelu_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t,
                                      CudaStream);
template void gelu_forward<float16>(float16*, const float16*, int64_t, CudaStream);
template void gelu_backward<float16>(float16*, const float16*, const float16*, int64_t,
                                     CudaStream);

}  // namespace backend::cuda
