// A build without CUDA, or without cuDNN's headers, has no cuDNN to load
// (see cudnn_library_cuda.cu).
#include "backend/common/error.hpp"
#include "backend/device/cudnn_library.hpp"

namespace backend {

LoadedCudnn load_cudnn() {
  common::fail(
      "cuDNN: this build has no cuDNN (configure with the CUDA toolkit and cuDNN 9's "
      "headers to use --attention-backend fused)");
}

}  // namespace backend
