// cuBLASLt's functions resolved with dlopen/dlsym (see cublaslt_library.cuh for why). The
// library is looked for first at the path the build found it (CUBLASLT_LIBRARY_FILE: the
// toolkit it was compiled against, kept at the same path in the .sqsh image), then by its
// soname through the dynamic loader's usual search (LD_LIBRARY_PATH, ld.so.cache), as a
// cluster's CUDA module or a GPU machine's own toolkit provides it. cuBLAS follows the CUDA
// major version, so the soname is libcublasLt.so.<CUDA major>.
#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.cuh"
#include "backend/device/cublaslt_library.hpp"

#ifndef CUBLASLT_LIBRARY_FILE
#error "CUBLASLT_LIBRARY_FILE (the cuBLASLt the build found) is set by backend/CMakeLists.txt"
#endif
#ifndef CUBLASLT_SONAME
#error "CUBLASLT_SONAME (libcublasLt.so.<CUDA major>) is set by backend/CMakeLists.txt"
#endif

namespace backend::cuda_detail {
namespace {

struct LoadedLibrary {
  void* handle = nullptr;
  std::string file;
  CublasLtLibrary functions{};
};

template <typename Function>
void resolve(const LoadedLibrary& library, Function& function, const char* name) {
  dlerror();
  void* symbol = dlsym(library.handle, name);
  if (symbol == nullptr) {
    const char* reason = dlerror();
    common::fail("cuBLASLt {} has no function {} ({}): the library is older than the CUDA "
                 "toolkit this build was compiled with",
                 library.file, name, reason != nullptr ? reason : "no such symbol");
  }
  function = reinterpret_cast<Function>(symbol);
}

LoadedLibrary load() {
  LoadedLibrary library;
  std::string tried;  // each candidate and why it did not load
  for (const char* candidate : {CUBLASLT_LIBRARY_FILE, CUBLASLT_SONAME}) {
    // RTLD_LOCAL: its symbols serve this table only. The handle stays open for the process.
    library.handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (library.handle != nullptr) {
      library.file = candidate;
      break;
    }
    const char* reason = dlerror();
    tried += fmt::format("\n  {}: {}", candidate, reason != nullptr ? reason : "not loaded");
  }
  if (library.handle == nullptr) {
    common::fail("cannot load cuBLASLt, which the CUDA device needs for its GEMMs; tried:{}\n"
                 "Install the CUDA toolkit's cuBLAS ({}) or put its directory on "
                 "LD_LIBRARY_PATH; --device cpu runs without it",
                 tried, CUBLASLT_SONAME);
  }
  CublasLtLibrary& f = library.functions;
  resolve(library, f.create, "cublasLtCreate");
  resolve(library, f.destroy, "cublasLtDestroy");
  resolve(library, f.get_status_name, "cublasLtGetStatusName");
  resolve(library, f.get_status_string, "cublasLtGetStatusString");
  resolve(library, f.matmul, "cublasLtMatmul");
  resolve(library, f.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(library, f.matmul_desc_create, "cublasLtMatmulDescCreate");
  resolve(library, f.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(library, f.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  resolve(library, f.matmul_preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(library, f.matmul_preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(library, f.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(library, f.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  resolve(library, f.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  return library;
}

// Loaded once; a failure is not cached, so each attempt reports it (and a later one may succeed
// after the environment changed, which only tests do).
const LoadedLibrary& loaded() {
  static std::mutex mutex;
  static std::optional<LoadedLibrary> library;  // the handle stays open until the process ends
  std::lock_guard lock(mutex);
  if (!library) library = load();
  return *library;
}

}  // namespace

const CublasLtLibrary& cublaslt() { return loaded().functions; }

}  // namespace backend::cuda_detail

namespace backend {

std::string load_cublaslt() { return cuda_detail::loaded().file; }

}  // namespace backend
