// CPU twin of convert.hpp.
#include "backend/ops/convert.hpp"

#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {
namespace {

// output[i] = one(input[i]) over the threads: each conversion is one element's.
template <typename Out, typename In, typename One>
void convert_elements(Out* output, const In* input, int64_t count, One one) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = one(input[i]);
}

}  // namespace

void convert(bfloat16* output, const float* input, int64_t count) {
  convert_elements(output, input, count, [](float value) { return to_bfloat16(value); });
}

void convert(float16* output, const float* input, int64_t count) {
  convert_elements(output, input, count, [](float value) { return to_float16(value); });
}

void convert(float* output, const bfloat16* input, int64_t count) {
  convert_elements(output, input, count, [](bfloat16 value) { return to_float(value); });
}

void convert(float* output, const float16* input, int64_t count) {
  convert_elements(output, input, count, [](float16 value) { return to_float(value); });
}

}  // namespace backend::cpu
