// The plain C++ side of cudnn_library.cuh: loading cuDNN without naming its types, for tests and
// diagnostics (CI checks, without a GPU, that the library loads, has every function the fused
// attention calls, and accepts its operation graphs: ops/attention.hpp's
// cudnn_attention_graph_check).
#pragma once

#include <cstdint>
#include <string>

namespace backend {

struct LoadedCudnn {
  std::string file;     // where it was loaded from
  int64_t version = 0;  // cudnnGetVersion(): major·10000 + minor·100 + patch
};

// Loads cuDNN if not yet loaded. A common::Error when it cannot be loaded, lacks a function, is
// not version 9, or the build has no cuDNN.
LoadedCudnn load_cudnn();

}  // namespace backend
