// cuBLASLt loaded at run time (dlopen), not linked: the functions the project calls, resolved
// by name into one table the first time a CUDA device needs them.
//
// Why: a linked libcublasLt runs its static initialisers in every process that links the
// backend, GPU or not: about 0.4 s of CPU and 26,000 page faults at the start of every tool,
// every test process and every CPU-only run (measured on the 2-core CI machine kind), for a
// library only the CUDA device calls. Only .cu files include this header (it names cuBLASLt's
// types); cublaslt_library.hpp is the plain C++ side.
#pragma once

#include <cublasLt.h>

#include "backend/common/error.hpp"

namespace backend::cuda_detail {

struct CublasLtLibrary {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtGetStatusName) get_status_name;
  decltype(&::cublasLtGetStatusString) get_status_string;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) matmul_preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) matmul_preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
};

// The table, loading the library on the first call (thread-safe). A library that cannot be
// loaded, or lacks one of the functions, is a common::Error naming what was tried.
const CublasLtLibrary& cublaslt();

// cuBLASLt's own status names: the project loads libcublasLt, not libcublas.
[[noreturn]] inline void fail_cublas(cublasStatus_t status, const char* statement,
                                     const char* file, int line) {
  const CublasLtLibrary& library = cublaslt();
  common::fail("cuBLAS error {} ({}) in `{}` at {}:{}", library.get_status_name(status),
               library.get_status_string(status), statement, file, line);
}

}  // namespace backend::cuda_detail

// CUBLAS_CHECK: as CUDA_CHECK (core/cuda_check.cuh), for every cuBLASLt call.
#define CUBLAS_CHECK(statement)                                                              \
  do {                                                                                       \
    const cublasStatus_t cublas_check_status = (statement);                                  \
    if (cublas_check_status != CUBLAS_STATUS_SUCCESS) {                                      \
      ::backend::cuda_detail::fail_cublas(cublas_check_status, #statement, __FILE__, __LINE__); \
    }                                                                                        \
  } while (false)
