// CUDA twin of dropout.hpp (CPU twin: dropout_cpu.cpp): inverted dropout,
//   output[i] = input[i] · (keep[i] ? 1/(1 − p) : 0),
//   keep[i]   = dropout_keep(key, first_index + i, threshold)
// (the key read from device memory when the op runs where the Dropout holds its address)
// The mask is the CPU's element for element: the kernel calls the same constexpr
// dropout_keep/splitmix64 code (--expt-relaxed-constexpr, top-level CMakeLists.txt) on the
// global element index (offset by first_index for a slice of a larger tensor's mask), so which
// thread or pack computes element i does not matter. The scale is dropout.scale<float>()
// (1/(1 − p) in double, rounded once). A product with 0, not a 0, so a NaN or infinity in a
// dropped element still shows. p = 0 copies (or, in place, does nothing).
// Backward is the same map on the gradient. Elementwise (detail::map_kernel): deterministic,
// and output may alias input.
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/dropout.hpp"

namespace backend::cuda {
namespace {

struct ApplyMask {
  Dropout dropout;  // its key: dropout.key_in_force(), which may read device memory
  uint64_t threshold;
  float scale;
  __device__ float operator()(float x, float, int64_t index) const {
    const bool keep = dropout_keep(dropout.key_in_force(),
                                   dropout.first_index + static_cast<uint64_t>(index), threshold);
    return x * (keep ? scale : 0.0f);
  }
};

template <typename Scalar>
void apply(Scalar* output, const Scalar* input, int64_t count, const Dropout& dropout,
           CudaStream stream) {
  if (count <= 0) return;
  if (!dropout.active()) {
    if (output != input) {
      CUDA_CHECK(cudaMemcpyAsync(output, input, static_cast<size_t>(count) * sizeof(Scalar),
                                 cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  const ApplyMask mask{dropout, dropout.threshold(), dropout.scale<float>()};
  const auto* x = detail::device_pointer(input);
  detail::launch_map(detail::device_pointer(output), x, x, count, mask, stream);
}

}  // namespace

template <typename Scalar>
void dropout_forward(Scalar* output, const Scalar* input, int64_t count, const Dropout& dropout,
                     CudaStream stream) {
  apply(output, input, count, dropout, stream);
}

template <typename Scalar>
void dropout_backward(Scalar* dinput, const Scalar* doutput, int64_t count, const Dropout& dropout,
                      CudaStream stream) {
  // d(x · keep · scale)/dx = keep · scale: the same mask and scale.
  apply(dinput, doutput, count, dropout, stream);
}

template void dropout_forward<float>(float*, const float*, int64_t, const Dropout&, CudaStream);
template void dropout_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t, const Dropout&,
                                        CudaStream);
template void dropout_backward<float>(float*, const float*, int64_t, const Dropout&, CudaStream);
template void dropout_backward<bfloat16>(bfloat16*, const bfloat16*, int64_t, const Dropout&,
                                         CudaStream);
template void dropout_forward<float16>(float16*, const float16*, int64_t, const Dropout&,
                                       CudaStream);
template void dropout_backward<float16>(float16*, const float16*, int64_t, const Dropout&,
                                        CudaStream);

}  // namespace backend::cuda
