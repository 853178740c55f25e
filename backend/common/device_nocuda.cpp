// Device discovery for builds without CUDA (WITH_CUDA=OFF or no toolkit found).
#include "backend/common/device.hpp"

namespace common {

CudaInventory discover_cuda_devices() {
  CudaInventory inventory;
  inventory.unavailable_reason =
      "this build has no CUDA support (reconfigure with a CUDA toolkit and -DWITH_CUDA=ON)";
  return inventory;
}

}  // namespace common
