// cuDNN's graph API resolved with dlopen/dlsym (see cudnn_library.cuh for why), looked for as
// cuBLASLt is: first where the build found it (CUDNN_LIBRARY_FILE), then by its soname through
// the dynamic loader's search. cuDNN's soname follows its own major version: libcudnn.so.9.
#include <fmt/format.h>

#include <string>

#include "backend/common/error.hpp"
#include "backend/device/cudnn_library.cuh"
#include "backend/device/cudnn_library.hpp"
#include "backend/device/shared_library.hpp"

#ifndef CUDNN_LIBRARY_FILE
#error "CUDNN_LIBRARY_FILE (the cuDNN the build found) is set by backend/CMakeLists.txt"
#endif

namespace backend::cuda_detail {
namespace {

constexpr const char* kCudnnSoname = "libcudnn.so.9";

struct LoadedLibrary {
  SharedLibrary library;
  CudnnLibrary functions{};
  int64_t version = 0;
};

LoadedLibrary load() {
  LoadedLibrary loaded{open_shared_library(
      {CUDNN_LIBRARY_FILE, kCudnnSoname},
      "cuDNN, which --attention-backend fused (and auto's first choice) needs",
      fmt::format("Install cuDNN 9 for CUDA {} ({}: a PyTorch install ships it under "
                  "nvidia/cudnn/lib) or put its directory on LD_LIBRARY_PATH; "
                  "--attention-backend flash or local run without it",
                  CUDART_VERSION / 1000, kCudnnSoname))};
  CudnnLibrary& f = loaded.functions;
  auto resolve = [&](auto& function, const char* name) {
    resolve_function(loaded.library, function, name, "cuDNN");
  };
  resolve(f.get_version, "cudnnGetVersion");
  resolve(f.get_error_string, "cudnnGetErrorString");
  resolve(f.get_last_error_string, "cudnnGetLastErrorString");
  resolve(f.create, "cudnnCreate");
  resolve(f.destroy, "cudnnDestroy");
  resolve(f.set_stream, "cudnnSetStream");
  resolve(f.create_descriptor, "cudnnBackendCreateDescriptor");
  resolve(f.destroy_descriptor, "cudnnBackendDestroyDescriptor");
  resolve(f.finalize, "cudnnBackendFinalize");
  resolve(f.set_attribute, "cudnnBackendSetAttribute");
  resolve(f.get_attribute, "cudnnBackendGetAttribute");
  resolve(f.execute, "cudnnBackendExecute");
  loaded.version = static_cast<int64_t>(f.get_version());
  if (loaded.version / 10000 != 9) {
    common::fail("cuDNN {} is version {}.{}.{}; the fused attention is built for cuDNN 9",
                 loaded.library.file, loaded.version / 10000, loaded.version / 100 % 100,
                 loaded.version % 100);
  }
  return loaded;
}

const LoadedLibrary& loaded() {
  return load_once(&load);
}

}  // namespace

const CudnnLibrary& cudnn() {
  return loaded().functions;
}

std::string cudnn_status_text(cudnnStatus_t status) {
  const CudnnLibrary& library = cudnn();
  char message[1024] = {};
  library.get_last_error_string(message, sizeof message);
  std::string text = library.get_error_string(status);
  if (message[0] != '\0') text += fmt::format(" ({})", message);
  return text;
}

}  // namespace backend::cuda_detail

namespace backend {

LoadedCudnn load_cudnn() {
  const auto& library = cuda_detail::loaded();
  return {library.library.file, library.version};
}

}  // namespace backend
