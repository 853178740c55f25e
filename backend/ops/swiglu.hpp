// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), Megatron's --swiglu: linear_fc1
// produces 2F features per row, chunked as torch.chunk(y, 2, dim=-1) into a = y[:, 0:F) and
// b = y[:, F:2F) (megatron/core/fusions/fused_bias_swiglu.py, core's MLP with
// gated_linear_unit and silu), then
//   σ(a) = 1 / (1 + e^(−a)),   silu(a) = a · σ(a)
//   h = silu(a) · b                                  (N, F)
// Backward, with dh the gradient of h:
//   da = dh · b · σ(a) · (1 + a · (1 − σ(a)))
//   db = dh · silu(a)
// written as dinput = [da | db] per row, the layout of the forward's input.
// Contract: no parameters; dinput is overwritten (=). Input and output have different
// shapes, so they may not alias.
// Elementwise per row, so results do not depend on the thread count.
// Dimensions: N rows (B·T), F features after the gate (--ffn-hidden-size).
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void swiglu_forward(Scalar* output,       // (N, F)
                    const Scalar* input,  // (N, 2F) per row [a | b]
                    int64_t rows, int64_t features);

template <typename Scalar>
void swiglu_backward(Scalar* dinput,         // (N, 2F) =
                     const Scalar* doutput,  // (N, F)
                     const Scalar* input,    // (N, 2F) the forward's input
                     int64_t rows, int64_t features);

}  // namespace backend::cpu

// The CUDA twin (swiglu_cuda.cu), Scalar float, bfloat16 or float16 (computed in float).
namespace backend::cuda {

template <typename Scalar>
void swiglu_forward(Scalar* output,       // (N, F)
                    const Scalar* input,  // (N, 2F) per row [a | b]
                    int64_t rows, int64_t features, CudaStream stream);

template <typename Scalar>
void swiglu_backward(Scalar* dinput,         // (N, 2F) =
                     const Scalar* doutput,  // (N, F)
                     const Scalar* input,    // (N, 2F) the forward's input
                     int64_t rows, int64_t features, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory.
namespace backend::ops {

void swiglu_forward(Device& device, View output, View input, int64_t rows, int64_t features);
void swiglu_backward(Device& device, View dinput, View doutput, View input, int64_t rows,
                     int64_t features);

}  // namespace backend::ops
