// Device discovery through the CUDA runtime (built when nvcc is found); see cuda_inventory.hpp.
// No driver, or a driver too old for this runtime, is reported as "no GPU" with the reason in
// plain words (cuda_unavailable_reason).
#include <cuda_runtime.h>

#include <cstdlib>

#include "backend/device/cuda_inventory.hpp"

namespace backend {

CudaInventory discover_cuda_devices() {
  CudaInventory inventory;
  inventory.built_with_cuda = true;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    int driver_version = 0, runtime_version = 0;
    cudaDriverGetVersion(&driver_version);  // 0 when no driver is installed
    cudaRuntimeGetVersion(&runtime_version);
    const CudaUnavailable kind =
        status == cudaErrorInsufficientDriver
            ? (driver_version == 0 ? CudaUnavailable::no_driver : CudaUnavailable::old_driver)
        : status == cudaErrorNoDevice ? CudaUnavailable::no_device
                                      : CudaUnavailable::other;
    inventory.unavailable_reason =
        cuda_unavailable_reason(kind, driver_version, runtime_version,
                                std::getenv("CUDA_VISIBLE_DEVICES"), cudaGetErrorString(status));
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
