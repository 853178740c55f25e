// The cuBLASLt products of a linear layer as GemmKeys (device/gemm_plans.cuh), shared by
// linear_cuda.cu (the plain layer, its bias in the epilogue) and linear_gelu_cuda.cu (the same
// products with GELU's epilogues). Row-major x (N, IN), W (OUT, IN), y (N, OUT) read as their
// column-major transposes:
//   forward        yᵀ (OUT, N) = op_T(W stored (IN, OUT)) · xᵀ (IN, N)   m = OUT, n = N, k = IN
//   input gradient dxᵀ (IN, N) = W (IN, OUT) · dyᵀ (OUT, N)              m = IN, n = N, k = OUT
// An aux matrix has D's shape, leading dimension m.
#pragma once

#include <cstdint>

#include "backend/device/gemm_plans.cuh"

namespace backend::cuda {

template <typename Scalar>
GemmKey forward_product_key(const Scalar* output, const Scalar* input, const Scalar* weight,
                            int64_t rows, int64_t in_features, int64_t out_features,
                            GemmEpilogue epilogue, const Scalar* bias,
                            const Scalar* aux = nullptr) {
  return {.m = out_features,
          .n = rows,
          .k = in_features,
          .transpose_a = true,
          .transpose_b = false,
          .a_type = gemm_data_type<Scalar>(),
          .c_type = gemm_data_type<Scalar>(),
          .epilogue = epilogue,
          .align_a = gemm_alignment(weight),
          .align_b = gemm_alignment(input),
          .align_c = gemm_alignment(output),
          .align_bias = bias != nullptr ? gemm_alignment(bias) : 0,
          .align_aux = aux != nullptr ? gemm_alignment(aux) : 0,
          .aux_ld = aux != nullptr ? out_features : 0};
}

template <typename Scalar>
GemmKey input_gradient_product_key(const Scalar* dinput, const Scalar* doutput,
                                   const Scalar* weight, int64_t rows, int64_t in_features,
                                   int64_t out_features, GemmEpilogue epilogue,
                                   const Scalar* aux = nullptr) {
  return {.m = in_features,
          .n = rows,
          .k = out_features,
          .transpose_a = false,
          .transpose_b = false,
          .a_type = gemm_data_type<Scalar>(),
          .c_type = gemm_data_type<Scalar>(),
          .epilogue = epilogue,
          .align_a = gemm_alignment(weight),
          .align_b = gemm_alignment(doutput),
          .align_c = gemm_alignment(dinput),
          .align_aux = aux != nullptr ? gemm_alignment(aux) : 0,
          .aux_ld = aux != nullptr ? in_features : 0};
}

}  // namespace backend::cuda
