// Residual connection of a pre-norm transformer block (x + f(x), He et al. 2016; llm.c's
// residual_forward):
//   output = input + branch
// Its backward is the identity into both operands: the residual stream's gradient passes
// through unchanged and the branch's gradient is added onto it, which is the same addition,
// so residual_forward(dstream, dstream, dbranch, n) is the backward.
// Contract: no parameters. Elementwise, so output may alias input or branch.
// Dimensions: N elements (any shape, flattened).
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void residual_forward(Scalar* output,        // (N)
                      const Scalar* input,   // (N)
                      const Scalar* branch,  // (N)
                      int64_t count);

}  // namespace backend::cpu

// The CUDA twin (residual_cuda.cu), Scalar float, bfloat16 or float16 (added in float, rounded
// once).
namespace backend::cuda {

template <typename Scalar>
void residual_forward(Scalar* output,        // (N)
                      const Scalar* input,   // (N)
                      const Scalar* branch,  // (N)
                      int64_t count, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory, over all of input's elements.
namespace backend::ops {

void residual_forward(Device& device, View output, View input, View branch);

}  // namespace backend::ops
