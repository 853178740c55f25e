// A GPU library loaded at run time (dlopen), not linked, so that CPU-only hosts start and pay
// nothing for it (cublaslt_library.cuh says why; cudnn_library.cuh). The candidates are tried in
// order, typically the file the build found and then the soname through the dynamic loader's
// usual search (LD_LIBRARY_PATH, ld.so.cache), as a cluster's CUDA module or a PyTorch install
// provides it. The handle stays open until the process ends.
#pragma once

#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace backend::cuda_detail {

struct SharedLibrary {
  void* handle = nullptr;
  std::string file;  // the candidate that loaded
};

// The first candidate that loads (RTLD_NOW | RTLD_LOCAL: its symbols serve the caller's table
// only). common::Error otherwise, naming `what`, each candidate with the loader's reason, and
// `advice` (how to install it or where --device cpu runs without it).
SharedLibrary open_shared_library(std::initializer_list<const char*> candidates,
                                  std::string_view what, std::string_view advice);

// The function `name` of `library`. common::Error naming the library when it lacks it (a
// library older than the headers this build was compiled against).
void* shared_library_symbol(const SharedLibrary& library, const char* name, std::string_view what);

template <typename Function>
void resolve_function(const SharedLibrary& library, Function& function, const char* name,
                      std::string_view what) {
  function = reinterpret_cast<Function>(shared_library_symbol(library, name, what));
}

// What `load` returns, loaded on the first call (thread-safe) and kept until the process ends.
// A failure is not kept, so each attempt reports it (and a later one may succeed after the
// environment changed, which only tests do). One instance per Loaded type.
template <typename Loaded>
const Loaded& load_once(Loaded (*load)()) {
  static std::mutex mutex;
  static std::optional<Loaded> loaded;
  std::lock_guard lock(mutex);
  if (!loaded) loaded = load();
  return *loaded;
}

}  // namespace backend::cuda_detail
