// The words for a machine whose CUDA runtime lists no GPU (cuda_unavailable_reason): plain about
// a missing driver, which the runtime calls "CUDA driver version is insufficient for CUDA
// runtime version" as if an update would help; and the GPU each local rank takes.
#include "backend/device/cuda_inventory.hpp"

#include <doctest/doctest.h>

#include <string>

#include "backend/common/error.hpp"

using backend::CudaUnavailable;
using backend::cuda_unavailable_reason;

TEST_CASE("no GPU: a missing driver, an old one, none visible, and other errors in plain words") {
  const std::string runtime_text = "CUDA driver version is insufficient for CUDA runtime version";
  const std::string no_driver =
      cuda_unavailable_reason(CudaUnavailable::no_driver, 0, 12040, nullptr, runtime_text);
  CHECK(no_driver == "no NVIDIA driver is installed on this machine (no libcuda.so.1), so it has no "
                     "GPU to use");
  CHECK(cuda_unavailable_reason(CudaUnavailable::old_driver, 12020, 12040, nullptr, runtime_text) ==
        "the NVIDIA driver supports CUDA up to 12.2, older than the CUDA 12.4 runtime this build "
        "uses: update the driver to use the GPU");
  CHECK(cuda_unavailable_reason(CudaUnavailable::no_device, 12040, 12040, "", "no CUDA-capable") ==
        "the NVIDIA driver shows no device with CUDA_VISIBLE_DEVICES='' (unset it, or name a GPU "
        "that `nvidia-smi -L` lists)");
  CHECK(cuda_unavailable_reason(CudaUnavailable::no_device, 12040, 12040, nullptr, "") ==
        "the NVIDIA driver is installed but finds no device");
  CHECK(cuda_unavailable_reason(CudaUnavailable::other, 12040, 12040, nullptr, "unknown error") ==
        "the CUDA runtime cannot list the GPUs: \"unknown error\"");
}

TEST_CASE("a node's ranks take its visible GPUs in turn, sharing where there are fewer") {
  // Eight ranks on eight GPUs one each; on one GPU all share it; twelve on eight wrap around.
  for (int64_t rank = 0; rank < 8; ++rank) CHECK(backend::gpu_for_local_rank(rank, 8) == rank);
  for (int64_t rank = 0; rank < 4; ++rank) CHECK(backend::gpu_for_local_rank(rank, 1) == 0);
  CHECK(backend::gpu_for_local_rank(11, 8) == 3);
  CHECK_THROWS_WITH_AS(backend::gpu_for_local_rank(0, 0),
                       "no GPU is visible to place local rank 0 on", common::Error);
  CHECK_THROWS_WITH_AS(backend::gpu_for_local_rank(-1, 2),
                       doctest::Contains("local rank -1 (from the launcher's environment)"),
                       common::Error);
}
