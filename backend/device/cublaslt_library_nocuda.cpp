// A build without CUDA has no cuBLASLt to load (see cublaslt_library_cuda.cu).
#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.hpp"

namespace backend {

std::string load_cublaslt() {
  common::fail("cuBLASLt: this build has no CUDA (configure with the CUDA toolkit to use a GPU)");
}

}  // namespace backend
