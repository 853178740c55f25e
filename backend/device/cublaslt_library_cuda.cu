// cuBLASLt's functions resolved with dlopen/dlsym (see cublaslt_library.cuh for why). The
// library is looked for first at the path the build found it (CUBLASLT_LIBRARY_FILE: the
// toolkit it was compiled against, kept at the same path in the .sqsh image), then by its
// soname through the dynamic loader's usual search (LD_LIBRARY_PATH, ld.so.cache), as a
// cluster's CUDA module or a GPU machine's own toolkit provides it. cuBLAS follows the CUDA
// major version, so the soname is libcublasLt.so.<CUDA major>.
#include <fmt/format.h>

#include <string>

#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.cuh"
#include "backend/device/cublaslt_library.hpp"
#include "backend/device/shared_library.hpp"

#ifndef CUBLASLT_LIBRARY_FILE
#error "CUBLASLT_LIBRARY_FILE (the cuBLASLt the build found) is set by backend/CMakeLists.txt"
#endif
#ifndef CUBLASLT_SONAME
#error "CUBLASLT_SONAME (libcublasLt.so.<CUDA major>) is set by backend/CMakeLists.txt"
#endif

namespace backend::cuda_detail {
namespace {

struct LoadedLibrary {
  SharedLibrary library;
  CublasLtLibrary functions{};
};

LoadedLibrary load() {
  LoadedLibrary loaded{open_shared_library(
      {CUBLASLT_LIBRARY_FILE, CUBLASLT_SONAME},
      "cuBLASLt, which the CUDA device needs for its GEMMs",
      fmt::format("Install the CUDA toolkit's cuBLAS ({}) or put its directory on "
                  "LD_LIBRARY_PATH; --device cpu runs without it",
                  CUBLASLT_SONAME))};
  CublasLtLibrary& f = loaded.functions;
  auto resolve = [&](auto& function, const char* name) {
    resolve_function(loaded.library, function, name, "cuBLASLt");
  };
  resolve(f.create, "cublasLtCreate");
  resolve(f.destroy, "cublasLtDestroy");
  resolve(f.get_status_name, "cublasLtGetStatusName");
  resolve(f.get_status_string, "cublasLtGetStatusString");
  resolve(f.matmul, "cublasLtMatmul");
  resolve(f.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(f.matmul_desc_create, "cublasLtMatmulDescCreate");
  resolve(f.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(f.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  resolve(f.matmul_preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(f.matmul_preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(f.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(f.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  resolve(f.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  return loaded;
}

const LoadedLibrary& loaded() {
  return load_once(&load);
}

}  // namespace

const CublasLtLibrary& cublaslt() { return loaded().functions; }

}  // namespace backend::cuda_detail

namespace backend {

std::string load_cublaslt() {
  return cuda_detail::loaded().library.file;
}

}  // namespace backend
