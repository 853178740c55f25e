// CUDA twin of residual.hpp (CPU twin: residual_cpu.cpp): output = input + branch, one 16-byte
// pack per thread (detail::map_kernel, cuda_common.cuh), added in float and rounded once to
// Scalar. Elementwise, so deterministic, and output may alias either operand.
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/residual.hpp"

namespace backend::cuda {
namespace {

struct Add {
  __device__ float operator()(float a, float b, int64_t) const { return a + b; }
};

}  // namespace

template <typename Scalar>
void residual_forward(Scalar* output, const Scalar* input, const Scalar* branch, int64_t count,
                      CudaStream stream) {
  detail::launch_map(detail::device_pointer(output), detail::device_pointer(input),
                     detail::device_pointer(branch), count, Add{}, stream);
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, CudaStream);
template void residual_forward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t,
                                         CudaStream);
template void residual_forward<float16>(float16*, const float16*, const float16*, int64_t,
                                        CudaStream);

}  // namespace backend::cuda
