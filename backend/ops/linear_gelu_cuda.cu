// CUDA twin of linear_gelu.hpp (CPU twin: linear_gelu_cpu.cpp): in bf16 and fp16, GELU in
// cuBLASLt's epilogue (docs/gemm_epilogues.md), with linear_cuda.cu's row-major to
// column-major reading:
//   forward   hᵀ (F, N) = W1 (F, C, stored (C, F) read transposed) · xᵀ (C, N) + b1,
//             aᵀ = GELU(hᵀ)       GELU_AUX_BIAS (GELU_AUX without a bias): D = a, aux = h
//   backward  dhᵀ (F, N) = W2ᵀ (F, C) · dyᵀ (C, N) ∘ GELU′(hᵀ)
//                                 DGELU, aux = h; the weight and bias gradients as
//                                 linear_backward's (its dinput skipped)
// The aux matrix has D's shape and type, leading dimension F, which cuBLASLt needs a multiple
// of 8. Elsewhere (fp32, another F, or an epilogue the heuristic refuses, which GemmPlans
// remembers and logs once) the separate products and GELU kernels run: linear_cuda.cu's and
// gelu_cuda.cu's twins, the same results.
// Deterministic as linear_cuda.cu: one algorithm per plan, the same workspace every call.
#include <type_traits>

#include "backend/device/gemm_plans.cuh"
#include "backend/ops/gelu.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/linear_gelu.hpp"
#include "backend/ops/linear_products.cuh"

namespace backend::cuda {
namespace {

// Whether the epilogue may be tried: 16-bit operands (fp32 stays the CPU-matching reference)
// and an aux leading dimension cuBLASLt accepts.
template <typename Scalar>
bool epilogue_fits(int64_t rows, int64_t in_features, int64_t out_features, int64_t aux_ld) {
  return !std::is_same_v<Scalar, float> && rows > 0 && in_features > 0 && out_features > 0 &&
         aux_ld % 8 == 0;
}

}  // namespace

template <typename Scalar>
void linear_gelu_forward(Scalar* activation, Scalar* preactivation, const Scalar* input,
                         const Scalar* weight, const Scalar* bias, int64_t rows,
                         int64_t in_features, int64_t out_features, GemmPlans& plans,
                         CudaStream stream) {
  if (epilogue_fits<Scalar>(rows, in_features, out_features, out_features)) {
    const GemmKey key =
        forward_product_key(activation, input, weight, rows, in_features, out_features,
                            bias != nullptr ? GemmEpilogue::gelu_aux_bias : GemmEpilogue::gelu_aux,
                            bias, preactivation);
    if (plans.try_matmul(key, weight, input, activation, {.bias = bias, .aux = preactivation}, 0.0f,
                         stream)) {
      return;
    }
  }
  linear_forward(preactivation, input, weight, bias, rows, in_features, out_features, plans,
                 stream);
  gelu_forward(activation, preactivation, rows * out_features, stream);
}

template <typename Scalar>
void linear_dgelu_backward(Scalar* dpreactivation, float* dweight, float* dbias,
                           const Scalar* doutput, const Scalar* activation, const Scalar* weight,
                           const Scalar* preactivation, int64_t rows, int64_t in_features,
                           int64_t out_features, GemmPlans& plans, float* scratch,
                           CudaStream stream) {
  if (epilogue_fits<Scalar>(rows, in_features, out_features, in_features)) {
    const GemmKey key =
        input_gradient_product_key(dpreactivation, doutput, weight, rows, in_features, out_features,
                                   GemmEpilogue::dgelu, preactivation);
    if (plans.try_matmul(key, weight, doutput, dpreactivation, {.aux = preactivation}, 0.0f,
                         stream)) {
      linear_backward<Scalar>(nullptr, dweight, dbias, doutput, activation, weight, rows,
                              in_features, out_features, plans, scratch, stream);
      return;
    }
  }
  linear_backward(dpreactivation, dweight, dbias, doutput, activation, weight, rows, in_features,
                  out_features, plans, scratch, stream);
  gelu_backward(dpreactivation, dpreactivation, preactivation, rows * in_features, stream);
}

#define BACKEND_INSTANTIATE_LINEAR_GELU_CUDA(Scalar)                                              \
  template void linear_gelu_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*,       \
                                            const Scalar*, int64_t, int64_t, int64_t, GemmPlans&, \
                                            CudaStream);                                          \
  template void linear_dgelu_backward<Scalar>(                                                    \
      Scalar*, float*, float*, const Scalar*, const Scalar*, const Scalar*, const Scalar*,        \
      int64_t, int64_t, int64_t, GemmPlans&, float*, CudaStream);
BACKEND_INSTANTIATE_LINEAR_GELU_CUDA(float)
BACKEND_INSTANTIATE_LINEAR_GELU_CUDA(bfloat16)
BACKEND_INSTANTIATE_LINEAR_GELU_CUDA(float16)
#undef BACKEND_INSTANTIATE_LINEAR_GELU_CUDA

}  // namespace backend::cuda
