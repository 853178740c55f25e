// The GPT-2 MLP's first linear layer and its GELU as one op, and the second layer's backward
// with GELU's backward as one op (docs/gemm_epilogues.md; Megatron's bias-GELU fusion, llm.c's
// GELU epilogue), for the MLP with --swiglu off:
//   forward   h = x · W1ᵀ + b1,  a = GELU(h)                 (h kept: the backward's input)
//   backward  dW2 += dyᵀ · a,  db2 += Σ_rows dy,  dh = (dy · W2) ∘ GELU′(h)
// with GELU the tanh approximation of gelu.hpp. The products are linear.hpp's; the CPU twins
// are linear.hpp's then gelu.hpp's twins (the same bits as calling them in turn). On a GPU in
// bf16 or fp16 the GELU runs in the GEMM's epilogue (cuBLASLt's GELU_AUX_BIAS writing h as the
// aux matrix, DGELU reading it), so the separate GELU kernels and their two passes over the
// (N, F) activations leave the step; where cuBLASLt has no algorithm for the epilogue, the
// aux leading dimension F is not a multiple of 8, or in fp32 (the reference path, which the
// CPU twin must match to 1e-4), the separate kernels run. Inside the epilogue GELU is computed
// from the fp32 accumulator rather than from h rounded to bf16, so the GPU's a may differ from
// the CPU's by a bf16 rounding of its input.
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Dimensions: N rows (B·T), C the layer's input features (fc1 in, fc2 out), F the MLP's
// hidden features (fc1 out, fc2 in).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/cuda_context.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void linear_gelu_forward(Scalar* activation,                        // (N, F) a
                         Scalar* preactivation,                     // (N, F) h
                         const Scalar* input,                       // (N, C)
                         const Scalar* weight,                      // (F, C)
                         const std::type_identity_t<Scalar>* bias,  // (F) or nullptr
                         int64_t rows, int64_t in_features, int64_t out_features);

// The backward of y = a · W2ᵀ + b2 with a = GELU(h): W2 is (C, F), in_features F.
template <typename Scalar>
void linear_dgelu_backward(std::type_identity_t<Scalar>* dpreactivation,  // (N, F) dh =
                           Scalar* dweight,                               // (C, F) +=
                           std::type_identity_t<Scalar>* dbias,           // (C) +=, or nullptr
                           const Scalar* doutput,                         // (N, C) dy
                           const Scalar* activation,                      // (N, F) a
                           const Scalar* weight,                          // (C, F)
                           const Scalar* preactivation,                   // (N, F) h
                           int64_t rows, int64_t in_features, int64_t out_features);

}  // namespace backend::cpu

// The CUDA twins (linear_gelu_cuda.cu): float, bfloat16 or float16 operands, fp32 weight and
// bias gradients; the bias gradient is linear.hpp's fixed-order column sums in `scratch`
// (linear_backward_scratch_floats(rows, out_features) floats).
namespace backend::cuda {

template <typename Scalar>
void linear_gelu_forward(Scalar* activation, Scalar* preactivation, const Scalar* input,
                         const Scalar* weight, const Scalar* bias, int64_t rows,
                         int64_t in_features, int64_t out_features, GemmPlans& plans,
                         CudaStream stream);

template <typename Scalar>
void linear_dgelu_backward(Scalar* dpreactivation, float* dweight, float* dbias,
                           const Scalar* doutput, const Scalar* activation, const Scalar* weight,
                           const Scalar* preactivation, int64_t rows, int64_t in_features,
                           int64_t out_features, GemmPlans& plans, float* scratch,
                           CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory, as linear.hpp's (the device's observer is told the products'
// floating-point operations: 2·N·C·F forward, 4·N·C·F backward).
namespace backend::ops {

void linear_gelu_forward(Device& device, View activation, View preactivation, View input,
                         View weight, View bias, int64_t rows, int64_t in_features,
                         int64_t out_features);
void linear_dgelu_backward(Device& device, View dpreactivation, View dweight, View dbias,
                           View doutput, View activation, View weight, View preactivation,
                           int64_t rows, int64_t in_features, int64_t out_features);

}  // namespace backend::ops
