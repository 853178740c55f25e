// make_cuda_device and cuda_placement in a build without CUDA: refused with what to do instead.
#include "backend/common/error.hpp"
#include "backend/device/cuda_device.hpp"

namespace backend {

std::unique_ptr<Device> make_cuda_device(int index, const CudaDeviceOptions& /*options*/) {
  common::fail(
      "--device cuda:{} needs a build with CUDA; this one was configured without nvcc (rebuild "
      "with the CUDA toolkit on PATH, or use --device cpu)",
      index);
}

CudaPlacement cuda_placement(Device& device) {
  common::fail("{} is not a CUDA device: this build has no CUDA (rebuild with the CUDA toolkit "
               "on PATH)", device.name());
}

}  // namespace backend
