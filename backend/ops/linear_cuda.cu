// CUDA twin of linear.hpp through cuBLASLt (llm.c's matmul_cublaslt shows the approach; this
// is written for row-major views and cached plans).
//
// cuBLASLt is column-major; a row-major (R, C) matrix is the column-major (C, R) matrix, its
// transpose. So, with row-major x (N, IN), W (OUT, IN), y (N, OUT):
//   forward   y = x·W^T + b    ⇔  y^T (OUT, N)  = op_T(W^T as stored (IN, OUT)) · x^T (IN, N)
//                                  m = OUT, n = N, k = IN; the bias runs along m (BIAS epilogue)
//   dinput   dx = dy·W         ⇔  dx^T (IN, N)  = W^T (IN, OUT) · dy^T (OUT, N)
//                                  m = IN, n = N, k = OUT; beta = 0 (overwrites)
//   dweight dW += dy^T·x       ⇔  dW^T (IN, OUT) += x^T (IN, N) · op_T(dy^T as stored (OUT, N))
//                                  m = IN, n = OUT, k = N; beta = 1, C = D (accumulates)
// Types: fp32 operands with CUBLAS_COMPUTE_32F (not _FAST_TF32: fp32 results match the CPU to
// rounding), or bf16 or fp16 operands with fp32 compute; dW is fp32 in all (C/D fp32).
// dbias += Σ_rows dy: the norms' fixed-order column sums (launch_column_sums, per row-group
// partials in the scratch added in group order); no atomics.
//
// Determinism: the device's GEMM plans (device/gemm_plans.cuh) run one algorithm per shape,
// chosen once, with the same workspace every call, so a shape gives the same bits run after run.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/device/gemm_plans.cuh"
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/linear.hpp"
#include "backend/ops/linear_products.cuh"

namespace backend::cuda {
namespace {

// The bias gradient's terms for launch_column_sums: dbias[c] += Σ_r doutput[r, c].
template <typename T>
struct BiasGradientTerms {
  static constexpr int kSums = 1;
  const T* doutput;
  int64_t columns;
  __device__ void add(int64_t row, int64_t c, float (&sums)[1]) const {
    sums[0] += detail::to_float(doutput[row * columns + c]);
  }
};

}  // namespace


namespace {

void check_shape(const char* op, int64_t rows, int64_t in_features, int64_t out_features) {
  if (rows < 0 || in_features <= 0 || out_features <= 0) {
    common::fail("{}: {} rows, {} input and {} output features", op, rows, in_features,
                 out_features);
  }
}

}  // namespace

template <typename Scalar>
void linear_forward(Scalar* output, const Scalar* input, const Scalar* weight,
                    const Scalar* bias, int64_t rows, int64_t in_features, int64_t out_features,
                    GemmPlans& plans, CudaStream stream) {
  check_shape("linear_forward", rows, in_features, out_features);
  if (rows == 0) return;
  const GemmKey key =
      forward_product_key(output, input, weight, rows, in_features, out_features,
                          bias != nullptr ? GemmEpilogue::bias : GemmEpilogue::none, bias);
  plans.matmul(key, weight, input, output, {.bias = bias}, 0.0f, stream);
}

int64_t linear_backward_scratch_floats(int64_t rows, int64_t out_features) {
  return detail::column_sums_scratch_floats(1, rows, out_features);
}

template <typename Scalar>
void linear_backward(Scalar* dinput, float* dweight, float* dbias, const Scalar* doutput,
                     const Scalar* input, const Scalar* weight, int64_t rows, int64_t in_features,
                     int64_t out_features, GemmPlans& plans, float* scratch, CudaStream stream) {
  check_shape("linear_backward", rows, in_features, out_features);
  if (rows == 0) return;
  if (dinput != nullptr) {
    const GemmKey key = input_gradient_product_key(dinput, doutput, weight, rows, in_features,
                                                   out_features, GemmEpilogue::none);
    plans.matmul(key, weight, doutput, dinput, {}, 0.0f, stream);
  }
  const GemmKey key{.m = in_features,
                    .n = out_features,
                    .k = rows,
                    .transpose_a = false,
                    .transpose_b = true,
                    .a_type = gemm_data_type<Scalar>(),
                    .c_type = CUDA_R_32F,
                    .align_a = gemm_alignment(input),
                    .align_b = gemm_alignment(doutput),
                    .align_c = gemm_alignment(dweight)};
  plans.matmul(key, input, doutput, dweight, {}, 1.0f, stream);
  if (dbias != nullptr) {
    using T = detail::DeviceElementOf<Scalar>;
    detail::ColumnTargets<1> targets{};
    targets.columns[0] = dbias;
    detail::launch_column_sums(targets,
                               BiasGradientTerms<T>{detail::device_pointer(doutput), out_features},
                               scratch, rows, out_features, stream);
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, GemmPlans&, CudaStream);
template void linear_forward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*,
                                       const bfloat16*, int64_t, int64_t, int64_t, GemmPlans&,
                                       CudaStream);
template void linear_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, GemmPlans&, float*,
                                     CudaStream);
template void linear_backward<bfloat16>(bfloat16*, float*, float*, const bfloat16*, const bfloat16*,
                                        const bfloat16*, int64_t, int64_t, int64_t, GemmPlans&,
                                        float*, CudaStream);
template void linear_forward<float16>(float16*, const float16*, const float16*, const float16*,
                                      int64_t, int64_t, int64_t, GemmPlans&, CudaStream);
template void linear_backward<float16>(float16*, float*, float*, const float16*, const float16*,
                                       const float16*, int64_t, int64_t, int64_t, GemmPlans&,
                                       float*, CudaStream);

}  // namespace backend::cuda
