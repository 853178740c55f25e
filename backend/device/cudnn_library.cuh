// cuDNN loaded at run time (dlopen), not linked, as cuBLASLt is (cublaslt_library.cuh): only its
// graph (backend) API, for the fused attention (ops/attention_cudnn_cuda.cu,
// docs/cudnn_attention.md). libcudnn.so.9 is a small shim that loads libcudnn_graph.so.9 and
// the engine libraries from its own directory (a PyTorch install ships all of them). Only .cu
// files include this header (it names cuDNN's types); cudnn_library.hpp is the plain C++ side.
#pragma once

#include <cudnn_graph.h>

#include "backend/common/error.hpp"

namespace backend::cuda_detail {

struct CudnnLibrary {
  decltype(&::cudnnGetVersion) get_version;
  decltype(&::cudnnGetErrorString) get_error_string;
  decltype(&::cudnnGetLastErrorString) get_last_error_string;
  decltype(&::cudnnCreate) create;
  decltype(&::cudnnDestroy) destroy;
  decltype(&::cudnnSetStream) set_stream;
  decltype(&::cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&::cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&::cudnnBackendFinalize) finalize;
  decltype(&::cudnnBackendSetAttribute) set_attribute;
  decltype(&::cudnnBackendGetAttribute) get_attribute;
  decltype(&::cudnnBackendExecute) execute;
};

// The table, loading the library on the first call (thread-safe). A library that cannot be
// loaded, lacks one of the functions or is not major version 9 is a common::Error naming what
// was tried.
const CudnnLibrary& cudnn();

// cuDNN's status name and its last error message (the reason a graph or plan was refused).
std::string cudnn_status_text(cudnnStatus_t status);

}  // namespace backend::cuda_detail

// CUDNN_CHECK: as CUBLAS_CHECK, for the cuDNN calls whose failure is an error (not a refusal).
#define CUDNN_CHECK(statement)                                                                  \
  do {                                                                                          \
    const cudnnStatus_t cudnn_check_status = (statement);                                       \
    if (cudnn_check_status != CUDNN_STATUS_SUCCESS) {                                           \
      ::common::fail("cuDNN error {} in `{}` at {}:{}",                                         \
                     ::backend::cuda_detail::cudnn_status_text(cudnn_check_status), #statement, \
                     __FILE__, __LINE__);                                                       \
    }                                                                                           \
  } while (false)
