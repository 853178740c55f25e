// cuDNN is loaded at run time, not linked (device/cudnn_library.cuh), for the fused attention.
// Without a GPU, CI still checks that a CUDA build with cuDNN finds the library and every
// function the attention calls, that nothing loaded it before it was asked for, and that
// --attention-backend auto becomes flash, not an error, where it cannot be loaded.
#include "backend/device/cudnn_library.hpp"

#include <doctest/doctest.h>

#include <string>

#include "backend/common/error.hpp"
#include "backend/device/cuda_inventory.hpp"
#include "backend/train/trainer.hpp"
#include "mapped_library.hpp"

using test_support::mapped_into_process;

TEST_CASE(
    "cuDNN is loaded on demand (version 9, every function the attention calls) or refused "
    "by name, and auto falls back to flash without it") {
  const backend::CudaInventory inventory = backend::discover_cuda_devices();
  CHECK_FALSE(mapped_into_process("libcudnn"));
  backend::ModelArguments model;  // --attention-backend auto
  bool loaded = false;
  try {
    const backend::LoadedCudnn cudnn = backend::load_cudnn();
    loaded = true;
    CHECK(cudnn.file.find("libcudnn.so.9") != std::string::npos);
    CHECK(cudnn.version / 10000 == 9);
    CHECK(mapped_into_process("libcudnn"));
    CHECK(backend::load_cudnn().file == cudnn.file);  // loaded once
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CAPTURE(message);
    // A build without CUDA or without cuDNN's headers says so; one with them names the files
    // it tried and what to install.
    const bool no_cudnn_build = message.find("this build has no cuDNN") != std::string::npos;
    CHECK((no_cudnn_build || message.find("cannot load cuDNN") != std::string::npos));
    if (!inventory.built_with_cuda) CHECK(no_cudnn_build);
  }
  CHECK(backend::gpu_attention_backend(model) ==
        (loaded ? backend::AttentionBackend::automatic : backend::AttentionBackend::flash));
  model.attention_backend = backend::AttentionBackend::fused;
  if (loaded) {
    CHECK(backend::gpu_attention_backend(model) == backend::AttentionBackend::fused);
  } else {
    CHECK_THROWS_AS(backend::gpu_attention_backend(model), common::Error);
  }
}
