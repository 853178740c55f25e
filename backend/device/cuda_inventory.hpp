// Device discovery: which CUDA GPUs the runtime sees, for choosing where to train. The CPU
// path always exists; CUDA devices are listed only when the project was built with CUDA
// (cuda_inventory_cuda.cu, else cuda_inventory_nocuda.cpp: the build picks one) and a driver
// is present. A machine with the toolkit but no driver (e.g. a build host) reports no GPU
// rather than failing, and says so in those words: the CUDA runtime's own text for it, "CUDA
// driver version is insufficient for CUDA runtime version", reads like a driver to update
// (cuda_unavailable_reason tells the cases apart by the driver's version, 0 when none).
// Separate from the Device interface (device.hpp, docs/device.md): this only lists GPUs.
#pragma once

#include <cstddef>
#include <cstdint>
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

// Why the CUDA runtime lists no GPU, for the user (cuda_inventory.cpp, plain C++ so that every
// build can test the wording): no driver at all (cudaErrorInsufficientDriver with driver
// version 0), a driver older than the runtime, no device (cudaErrorNoDevice: none, or
// CUDA_VISIBLE_DEVICES hides them), or another runtime error, quoted.
enum class CudaUnavailable { no_driver, old_driver, no_device, other };

// The visible GPU a rank takes (issue 40): its rank on the node (the launcher's local rank:
// SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, LOCAL_RANK) modulo the visible
// GPUs, so that a node's ranks spread over its GPUs one each, and several ranks share a GPU
// where fewer are visible (testing many ranks on one GPU). common::Error for a negative local
// rank or no visible GPU.
int64_t gpu_for_local_rank(int64_t local_rank, int64_t visible_gpus);
std::string cuda_unavailable_reason(CudaUnavailable kind, int driver_version, int runtime_version,
                                    const char* visible_devices, const std::string& runtime_error);

}  // namespace backend
