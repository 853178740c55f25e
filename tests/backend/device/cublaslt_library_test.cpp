// cuBLASLt is loaded at run time, not linked (device/cublaslt_library.cuh). Without a GPU, CI
// still checks that a CUDA build finds the library and every function the GEMMs call, and
// that nothing loaded it before it was asked for; a build without CUDA refuses by name.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "backend/common/error.hpp"
#include "backend/device/cublaslt_library.hpp"
#include "backend/device/cuda_inventory.hpp"

namespace {

// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("cuBLASLt is loaded on demand, with every function the GEMMs call, or refused without CUDA") {
  // discover_cuda_devices (what --device auto asks) must not load it either.
  const backend::CudaInventory inventory = backend::discover_cuda_devices();
  CHECK_FALSE(mapped("libcublasLt"));
  if (!inventory.built_with_cuda) {
    CHECK_THROWS_WITH_AS(backend::load_cublaslt(), doctest::Contains("this build has no CUDA"),
                         common::Error);
    return;
  }
  const std::string file = backend::load_cublaslt();
  CHECK(file.find("libcublasLt.so.") != std::string::npos);
  CHECK(mapped("libcublasLt"));
  CHECK(backend::load_cublaslt() == file);  // loaded once
}
