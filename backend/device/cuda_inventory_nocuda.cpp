// Device discovery for builds without CUDA (WITH_CUDA=OFF or no toolkit found); see cuda_inventory.hpp.
#include "backend/device/cuda_inventory.hpp"

namespace backend {

CudaInventory discover_cuda_devices() {
  CudaInventory inventory;
  inventory.unavailable_reason =
      "this build has no CUDA support (reconfigure with a CUDA toolkit and -DWITH_CUDA=ON)";
  return inventory;
}

}  // namespace backend
