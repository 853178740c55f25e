// CUDA_CHECK: every CUDA runtime call in the *_cuda.cu files goes through it (cuBLASLt's calls
// through CUBLAS_CHECK, device/cublaslt_library.cuh), so a failure is a common::Error naming the
// statement, the file and the line and the runtime's own reason, never a silent error code or
// a later crash. Only .cu files include this header (no CUDA header in a .hpp). Kernel launches
// are checked with CUDA_CHECK(cudaGetLastError()) right after the launch.
#pragma once

#include <cuda_runtime.h>

#include "backend/common/error.hpp"

namespace backend::cuda_detail {

[[noreturn]] inline void fail_cuda(cudaError_t status, const char* statement, const char* file,
                                   int line) {
  common::fail("CUDA error {} ({}) in `{}` at {}:{}", cudaGetErrorName(status),
               cudaGetErrorString(status), statement, file, line);
}

}  // namespace backend::cuda_detail

#define CUDA_CHECK(statement)                                                            \
  do {                                                                                   \
    const cudaError_t cuda_check_status = (statement);                                   \
    if (cuda_check_status != cudaSuccess) {                                              \
      ::backend::cuda_detail::fail_cuda(cuda_check_status, #statement, __FILE__, __LINE__); \
    }                                                                                    \
  } while (false)
