// Device discovery. The CPU path always exists; CUDA devices are listed only when the
// project was built with CUDA (backend/common/device_cuda.cu) and a driver is present.
// A machine with the toolkit but no driver (e.g. a build host) reports no GPU rather
// than failing: the CUDA runtime's "driver version is insufficient" means "no GPU here".
#pragma once

#include <string>
#include <vector>

namespace common {

struct CudaDevice {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  size_t total_memory_bytes = 0;
};

struct CudaInventory {
  bool built_with_cuda = false;
  std::vector<CudaDevice> devices;
  std::string unavailable_reason;  // why `devices` is empty, for the user
};

CudaInventory discover_cuda_devices();

}  // namespace common
