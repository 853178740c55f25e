// cuBLASLt is loaded at run time, not linked (device/cublaslt_library.cuh). Without a GPU, CI
// still checks that a CUDA build finds the library and every function the GEMMs call, and
// that nothing loaded it before it was asked for; a build without CUDA refuses by name.
#include "backend/device/cublaslt_library.hpp"

#include <doctest/doctest.h>

#include <string>

#include "backend/common/error.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "mapped_library.hpp"

using test_support::mapped_into_process;

TEST_CASE("cuBLASLt is loaded on demand, with every function the GEMMs call, or refused without CUDA") {
  // discover_cuda_devices (what --device auto asks) must not load it either.
  const backend::CudaInventory inventory = backend::discover_cuda_devices();
  CHECK_FALSE(mapped_into_process("libcublasLt"));
  if (!inventory.built_with_cuda) {
    CHECK_THROWS_WITH_AS(backend::load_cublaslt(), doctest::Contains("this build has no CUDA"),
                         common::Error);
    return;
  }
  const std::string file = backend::load_cublaslt();
  CHECK(file.find("libcublasLt.so.") != std::string::npos);
  CHECK(mapped_into_process("libcublasLt"));
  CHECK(backend::load_cublaslt() == file);  // loaded once
}
