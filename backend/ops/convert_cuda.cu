// CUDA twin of convert.hpp (CPU twin: convert_cpu.cpp): fp32 → bf16 with __float2bfloat16_rn, fp32
// → fp16 with __float2half_rn, and back (exact), four elements per thread (a 16-byte and an 8-byte
// access) when both pointers allow it. A pure copy pass: 6 bytes per element, bandwidth-bound (a
// 124M-parameter working copy is 0.75 GB of traffic, about 0.3 ms on an H100).
#include "backend/ops/convert.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

template <int Width, typename Out, typename In>
__global__ void convert_kernel(Out* output, const In* input, int64_t count) {
  const int64_t packs = (count + Width - 1) / Width;
  for (const int64_t p : detail::grid_stride(packs)) {
    const int64_t first = p * Width;
    if (first + Width <= count) {
      float values[Width];
      detail::load_floats<Width>(values, input + first);
      detail::store_floats<Width>(output + first, values);
    } else {
      for (int64_t i = first; i < count; ++i) {
        output[i] = detail::from_float<Out>(detail::to_float(input[i]));
      }
    }
  }
}

// Four elements per thread where the fp32 side is 16-byte aligned and the 16-bit side 8-byte.
template <typename Out, typename In>
void convert_elements(Out* output, const In* input, int64_t count, CudaStream stream) {
  if (count <= 0) return;
  constexpr int kWidth = 4;
  const void* wide = sizeof(Out) == 4 ? static_cast<const void*>(output) : input;
  const void* narrow = sizeof(Out) == 4 ? static_cast<const void*>(input) : output;
  if (detail::aligned_16(wide) && reinterpret_cast<uintptr_t>(narrow) % 8 == 0) {
    convert_kernel<kWidth>
        <<<detail::grid_for((count + kWidth - 1) / kWidth), detail::kBlockSize, 0, stream>>>(
            output, input, count);
  } else {
    convert_kernel<1>
        <<<detail::grid_for(count), detail::kBlockSize, 0, stream>>>(output, input, count);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void convert(bfloat16* output, const float* input, int64_t count, CudaStream stream) {
  convert_elements(detail::device_pointer(output), input, count, stream);
}
void convert(float16* output, const float* input, int64_t count, CudaStream stream) {
  convert_elements(detail::device_pointer(output), input, count, stream);
}
void convert(float* output, const bfloat16* input, int64_t count, CudaStream stream) {
  convert_elements(output, detail::device_pointer(input), count, stream);
}
void convert(float* output, const float16* input, int64_t count, CudaStream stream) {
  convert_elements(output, detail::device_pointer(input), count, stream);
}

}  // namespace backend::cuda
