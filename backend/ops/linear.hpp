// Fully connected layer as torch.nn.Linear and Megatron's ColumnParallelLinear /
// RowParallelLinear store it (weight is (out, in)); llm.c's matmul_*:
//   y = x · W^T + b
// Backward:
//   dx  = dy · W                  (overwrites)
//   dW += dy^T · x
//   db += Σ_rows dy
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// The products run through OpenBLAS (sgemm / dgemm) in fixed tiles, the bias sum is a
// per-column loop: neither depends on the thread count.
// Optional pieces: bias and dbias may be nullptr (no bias, e.g. the output layer tied to the
// word embedding), dinput may be nullptr when the input needs no gradient. Their types do
// not take part in deducing Scalar, so a plain nullptr is accepted.
// Dimensions: N rows (B·T), IN input features, OUT output features.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/cuda_context.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void linear_forward(Scalar* output,                            // (N, OUT)
                    const Scalar* input,                       // (N, IN)
                    const Scalar* weight,                      // (OUT, IN)
                    const std::type_identity_t<Scalar>* bias,  // (OUT) or nullptr
                    int64_t rows, int64_t in_features, int64_t out_features);

template <typename Scalar>
void linear_backward(std::type_identity_t<Scalar>* dinput,  // (N, IN)   =, or nullptr to skip
                     Scalar* dweight,                       // (OUT, IN) +=
                     std::type_identity_t<Scalar>* dbias,   // (OUT) +=, or nullptr if no bias
                     const Scalar* doutput,                 // (N, OUT)
                     const Scalar* input,                   // (N, IN)
                     const Scalar* weight,                  // (OUT, IN)
                     int64_t rows, int64_t in_features, int64_t out_features);

}  // namespace backend::cpu

// CUDA twin (linear_cuda.cu): the same products through cuBLASLt, fp32 (TF32 off: the fp32
// result matches the CPU's to rounding) or bf16 operands with fp32 accumulation. The weight
// gradient and the bias gradient are fp32 whatever the operands (they accumulate over micro
// batches); dinput has the operands' type. The bias is added by cuBLASLt's BIAS epilogue,
// dbias by the norms' fixed-order column sums (cuda_common.cuh's launch_column_sums: per
// row-group partials in `scratch`, linear_backward_scratch_floats(rows, out_features) floats,
// added in group order; no atomics, the whole GPU busy): results are the same bits run after
// run.

namespace backend::cuda {

template <typename Scalar>  // float, bfloat16 or float16
void linear_forward(Scalar* output,        // (N, OUT)
                    const Scalar* input,   // (N, IN)
                    const Scalar* weight,  // (OUT, IN)
                    const Scalar* bias,    // (OUT) or nullptr
                    int64_t rows, int64_t in_features, int64_t out_features, GemmPlans& plans,
                    CudaStream stream);

int64_t linear_backward_scratch_floats(int64_t rows, int64_t out_features);

template <typename Scalar>                   // float, bfloat16 or float16
void linear_backward(Scalar* dinput,         // (N, IN) =, or nullptr to skip
                     float* dweight,         // (OUT, IN) +=
                     float* dbias,           // (OUT) +=, or nullptr if no bias
                     const Scalar* doutput,  // (N, OUT)
                     const Scalar* input,    // (N, IN)
                     const Scalar* weight,   // (OUT, IN)
                     int64_t rows, int64_t in_features, int64_t out_features, GemmPlans& plans,
                     float* scratch,  // linear_backward_scratch_floats(rows, out_features), dbias
                     CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory: fp32 or fp64 on the CPU; fp32, bf16 or fp16 operands on a GPU
// (dweight and dbias fp32), through the device's cuBLASLt plans. The device's observer is told
// the products' floating-point operations: 2·N·IN·OUT forward, twice that backward (once
// without dinput).
namespace backend::ops {

void linear_forward(Device& device, View output, View input, View weight, View bias,
                    int64_t rows, int64_t in_features, int64_t out_features);
void linear_backward(Device& device, View dinput, View dweight, View dbias, View doutput,
                     View input, View weight, int64_t rows, int64_t in_features,
                     int64_t out_features);

// The floating-point operations of one product of a (rows, in_features, out_features) layer,
// 2·N·IN·OUT, as the device's observer is told them: once forward, twice backward (once without
// dinput).
inline double linear_product_flops(int64_t rows, int64_t in_features, int64_t out_features) {
  return 2.0 * static_cast<double>(rows) * static_cast<double>(in_features) *
         static_cast<double>(out_features);
}

// A GPU backward's scratch for the bias gradient of (rows, out_features) output gradients, from
// the device's scratch; nullptr without a bias (dbias empty). For the ops that end in
// cuda::linear_backward.
float* linear_backward_scratch(Device& device, View dbias, int64_t rows, int64_t out_features,
                               const char* op);

}  // namespace backend::ops
