// CPU twin of convert.hpp.
#include "backend/ops/convert.hpp"

#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {

void convert(bfloat16* output, const float* input, int64_t count) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = to_bfloat16(input[i]);
}

void convert(float16* output, const float* input, int64_t count) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = to_float16(input[i]);
}

void convert(float* output, const bfloat16* input, int64_t count) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = to_float(input[i]);
}

void convert(float* output, const float16* input, int64_t count) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = to_float(input[i]);
}

}  // namespace backend::cpu
