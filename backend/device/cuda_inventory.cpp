// The words for a GPU the CUDA runtime cannot list, and the GPU a local rank takes; see
// cuda_inventory.hpp. Versions are the
// runtime's encoding, 1000 × major + 10 × minor (12040: CUDA 12.4).
#include "backend/device/cuda_inventory.hpp"

#include <fmt/format.h>

#include "backend/common/error.hpp"

namespace backend {

int64_t gpu_for_local_rank(int64_t local_rank, int64_t visible_gpus) {
  if (visible_gpus <= 0) common::fail("no GPU is visible to place local rank {} on", local_rank);
  if (local_rank < 0) {
    common::fail("local rank {} (from the launcher's environment) is negative", local_rank);
  }
  return local_rank % visible_gpus;
}

namespace {

std::string cuda_version_text(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

}  // namespace

std::string cuda_unavailable_reason(CudaUnavailable kind, int driver_version, int runtime_version,
                                    const char* visible_devices, const std::string& runtime_error) {
  switch (kind) {
    case CudaUnavailable::no_driver:
      return "no NVIDIA driver is installed on this machine (no libcuda.so.1), so it has no GPU "
             "to use";
    case CudaUnavailable::old_driver:
      return fmt::format("the NVIDIA driver supports CUDA up to {}, older than the CUDA {} runtime "
                         "this build uses: update the driver to use the GPU",
                         cuda_version_text(driver_version), cuda_version_text(runtime_version));
    case CudaUnavailable::no_device:
      if (visible_devices != nullptr) {
        return fmt::format("the NVIDIA driver shows no device with CUDA_VISIBLE_DEVICES='{}' "
                           "(unset it, or name a GPU that `nvidia-smi -L` lists)",
                           visible_devices);
      }
      return "the NVIDIA driver is installed but finds no device";
    case CudaUnavailable::other:
      break;
  }
  return fmt::format("the CUDA runtime cannot list the GPUs: \"{}\"", runtime_error);
}

}  // namespace backend
