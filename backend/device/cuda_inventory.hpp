// Device discovery: which CUDA GPUs the runtime sees, for choosing where to train. The CPU
// path always exists; CUDA devices are listed only when the project was built with CUDA
// (cuda_inventory_cuda.cu, else cuda_inventory_nocuda.cpp: the build picks one) and a driver
// is present. A machine with the toolkit but no driver (e.g. a build host) reports no GPU
// rather than failing: the CUDA runtime's "driver version is insufficient" means "no GPU here".
// Separate from the Device interface (device.hpp, docs/device.md): this only lists GPUs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace backend {

// One GPU as the runtime describes it (not a Device: cuda_device.hpp makes those).
struct CudaDeviceProperties {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  size_t total_memory_bytes = 0;
};

struct CudaInventory {
  bool built_with_cuda = false;
  std::vector<CudaDeviceProperties> devices;
  std::string unavailable_reason;  // why `devices` is empty, for the user
};

CudaInventory discover_cuda_devices();

}  // namespace backend
