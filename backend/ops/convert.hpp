// Element type conversion, fp32 → bf16 or fp16: the working copy of mixed precision. Under
// --bf16 (--fp16) the forward and backward read bf16 (fp16) weights while the optimizer updates
// fp32 master weights; after each update the working copy is rewritten from the master, as
// Megatron's Float16OptimizerWithFloat16Params copies its main params into the model's after a
// step. And back, bf16 or fp16 → fp32 (exact): gradients reduced in bf16
// (--grad-reduce-in-bf16) return to the fp32 buffer the optimizer reads.
//   output[i] = round_to_nearest_even_bf16(input[i])   (NaN stays a quiet NaN)
//   output[i] = round_to_nearest_even_fp16(input[i])   (±inf from 65520 up; subnormals kept)
//   output[i] = float(input[i])                        (every bf16 and fp16 value is an fp32 one)
// The rounding is element_type.hpp's to_bfloat16 / to_float16 on the CPU and
// __float2bfloat16_rn / __float2half_rn on the GPU, the same bits except a NaN's (the GPU gives
// its canonical NaN, the CPU keeps the payload's top bits). Contract: output and input do not
// overlap. Dimensions: N elements.
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

void convert(bfloat16* output,     // (N)
             const float* input,   // (N)
             int64_t count);
void convert(float16* output,      // (N)
             const float* input,   // (N)
             int64_t count);
void convert(float* output,          // (N)
             const bfloat16* input,  // (N)
             int64_t count);
void convert(float* output,         // (N)
             const float16* input,  // (N)
             int64_t count);

}  // namespace backend::cpu

// The CUDA twin (convert_cuda.cu).
namespace backend::cuda {

void convert(bfloat16* output,     // (N)
             const float* input,   // (N)
             int64_t count, CudaStream stream);
void convert(float16* output,      // (N)
             const float* input,   // (N)
             int64_t count, CudaStream stream);
void convert(float* output,          // (N)
             const bfloat16* input,  // (N)
             int64_t count, CudaStream stream);
void convert(float* output,         // (N)
             const float16* input,  // (N)
             int64_t count, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory: destination (bf16 or fp16) = source (f32) rounded to nearest
// even, of one element count (else common::Error naming both): the working copy of the fp32
// master weights. The CPU device makes working copies too (its other ops refuse to read them).
namespace backend::ops {

void convert(Device& device, View destination, View source);

}  // namespace backend::ops
