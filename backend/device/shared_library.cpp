// shared_library.hpp: dlopen's candidates in order, dlsym with the library named in errors.
#include "backend/device/shared_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include "backend/common/error.hpp"

namespace backend::cuda_detail {

SharedLibrary open_shared_library(std::initializer_list<const char*> candidates,
                                  std::string_view what, std::string_view advice) {
  std::string tried;  // each candidate and why it did not load
  for (const char* candidate : candidates) {
    void* handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return {handle, candidate};
    const char* reason = dlerror();
    tried += fmt::format("\n  {}: {}", candidate, reason != nullptr ? reason : "not loaded");
  }
  common::fail("cannot load {}; tried:{}\n{}", what, tried, advice);
}

void* shared_library_symbol(const SharedLibrary& library, const char* name, std::string_view what) {
  dlerror();
  void* symbol = dlsym(library.handle, name);
  if (symbol == nullptr) {
    const char* reason = dlerror();
    common::fail(
        "{} {} has no function {} ({}): the library is older than the headers this "
        "build was compiled with",
        what, library.file, name, reason != nullptr ? reason : "no such symbol");
  }
  return symbol;
}

}  // namespace backend::cuda_detail
