// CUDA_CHECK / CUBLAS_CHECK: every CUDA runtime and cuBLAS(Lt) call in the *_cuda.cu files goes
// through one of these, so a failure is a common::Error naming the statement, the file and the
// line and the library's own reason, never a silent error code or a later crash. Only .cu files
// include this header (the seam's first never). Kernel launches are checked with
// CUDA_CHECK(cudaGetLastError()) right after the launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.cuh"

namespace backend::cuda_detail {

[[noreturn]] inline void fail_cuda(cudaError_t status, const char* statement, const char* file,
                                   int line) {
  common::fail("CUDA error {} ({}) in `{}` at {}:{}", cudaGetErrorName(status),
               cudaGetErrorString(status), statement, file, line);
}

// cuBLASLt's own status names: the project loads libcublasLt, not libcublas.
[[noreturn]] inline void fail_cublas(cublasStatus_t status, const char* statement,
                                     const char* file, int line) {
  const CublasLtLibrary& library = cublaslt();
  common::fail("cuBLAS error {} ({}) in `{}` at {}:{}", library.get_status_name(status),
               library.get_status_string(status), statement, file, line);
}

}  // namespace backend::cuda_detail

#define CUDA_CHECK(statement)                                                            \
  do {                                                                                   \
    const cudaError_t cuda_check_status = (statement);                                   \
    if (cuda_check_status != cudaSuccess) {                                              \
      ::backend::cuda_detail::fail_cuda(cuda_check_status, #statement, __FILE__, __LINE__); \
    }                                                                                    \
  } while (false)

#define CUBLAS_CHECK(statement)                                                              \
  do {                                                                                       \
    const cublasStatus_t cublas_check_status = (statement);                                  \
    if (cublas_check_status != CUBLAS_STATUS_SUCCESS) {                                      \
      ::backend::cuda_detail::fail_cublas(cublas_check_status, #statement, __FILE__, __LINE__); \
    }                                                                                        \
  } while (false)
