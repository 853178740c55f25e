// The plain C++ side of cublaslt_library.cuh: loading cuBLASLt without naming its types, for
// tests and diagnostics (a CUDA build's tests check in CI, without a GPU, that the library
// loads and has every function the GEMMs call).
#pragma once

#include <string>

namespace backend {

// Loads cuBLASLt if not yet loaded and returns the file it was loaded from. A common::Error when
// it cannot be loaded, lacks a function, or the build has no CUDA.
std::string load_cublaslt();

}  // namespace backend
