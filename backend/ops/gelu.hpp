// GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2 and Megatron's fused bias-gelu
// (megatron/core/fusions/fused_bias_gelu.py) compute it; llm.c's gelu_*:
//   u = sqrt(2/π) · (x + 0.044715 · x³)
//   y = 0.5 · x · (1 + tanh(u))
//   dy/dx = 0.5 · (1 + tanh(u)) + 0.5 · x · (1 − tanh²(u)) · sqrt(2/π) · (1 + 3 · 0.044715 · x²)
// Contract: no parameters; dinput is overwritten (=). Elementwise, so output may alias input
// and dinput may alias doutput.
// Dimensions: N elements (any shape, flattened).
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void gelu_forward(Scalar* output,       // (N)
                  const Scalar* input,  // (N)
                  int64_t count);

template <typename Scalar>
void gelu_backward(Scalar* dinput,         // (N) =
                   const Scalar* doutput,  // (N)
                   const Scalar* input,    // (N) the forward's input
                   int64_t count);

}  // namespace backend::cpu

// The CUDA twin (gelu_cuda.cu), Scalar float, bfloat16 or float16 (computed in float, the CPU float
// path's formula).
namespace backend::cuda {

template <typename Scalar>
void gelu_forward(Scalar* output,       // (N)
                  const Scalar* input,  // (N)
                  int64_t count, CudaStream stream);

template <typename Scalar>
void gelu_backward(Scalar* dinput,         // (N) =
                   const Scalar* doutput,  // (N)
                   const Scalar* input,    // (N) the forward's input
                   int64_t count, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory, over all of input's elements: fp32 or fp64 on the CPU, fp32,
// bf16 or fp16 on a GPU.
namespace backend::ops {

void gelu_forward(Device& device, View output, View input);
void gelu_backward(Device& device, View dinput, View doutput, View input);

}  // namespace backend::ops
