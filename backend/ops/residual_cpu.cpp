// CPU twin of residual.hpp.
#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/residual.hpp"

namespace backend::cpu {

template <typename Scalar>
void residual_forward(Scalar* output, const Scalar* input, const Scalar* branch, int64_t count) {
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] + branch[i];
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);

}  // namespace backend::cpu
