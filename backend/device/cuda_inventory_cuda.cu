// Device discovery through the CUDA runtime (built when nvcc is found); see cuda_inventory.hpp.
// No driver, or a driver too old for this runtime, is reported as "no GPU" with the runtime's
// reason.
#include <cuda_runtime.h>

#include "backend/device/cuda_inventory.hpp"

namespace backend {

CudaInventory discover_cuda_devices() {
  CudaInventory inventory;
  inventory.built_with_cuda = true;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    inventory.unavailable_reason = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return inventory;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    inventory.devices.push_back({index, properties.name, properties.major, properties.minor,
                                 properties.totalGlobalMem});
  }
  if (inventory.devices.empty()) inventory.unavailable_reason = "no CUDA device found";
  return inventory;
}

}  // namespace backend
