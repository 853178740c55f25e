// The CUDA device's factory (cuda_device.cu when the build has CUDA, cuda_device_nocuda.cpp
// otherwise): the one place host code gets a GPU Device. The device owns its stream, its
// cuBLASLt handle and workspace (no global stream or handle), and checks every CUDA and cuBLAS
// call, naming the statement, file and line (cuda_check.cuh).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/core/cuda_stream.hpp"
#include "backend/device/device.hpp"

namespace backend {

// Device scratch the ops that need one (layernorm/rmsnorm backward, the reductions' partial
// sums) share (Device::scratch), allocated once when the device is made (never inside an op). An op
// needing more fails with the sizes; the caller passes what its largest shape needs (the ops'
// *_scratch_floats helpers · 4).
inline constexpr int64_t kDefaultCudaScratchBytes = int64_t{64} << 20;

// How a CUDA device is made: values, chosen by the caller (pretrain_gpt's flags).
struct CudaDeviceOptions {
  int64_t scratch_bytes = kDefaultCudaScratchBytes;
  // Which kernels compute attention (cuda_context.hpp). With fused or auto the device loads
  // cuDNN when it is made: fused fails there when cuDNN cannot be loaded, auto logs why and
  // runs as flash.
  AttentionBackend attention_backend = AttentionBackend::local;
  // --gemm-autotune: each product shape's algorithm timed among the heuristic's candidates
  // that give its first choice's bits (device/gemm_plans.cuh).
  bool gemm_autotune = false;
};

// GPU `index` as the CUDA runtime numbers them (after CUDA_VISIBLE_DEVICES). common::Error if
// the build has no CUDA, the index does not exist or the device cannot be initialised.
std::unique_ptr<Device> make_cuda_device(int index, const CudaDeviceOptions& options = {});

// Where a CUDA device's work runs: its GPU (the runtime's index) and its stream. For work of
// another library that must run in order with the device's ops (the NCCL communicator enqueues
// its collectives on this stream). common::Error naming the device for one that
// make_cuda_device did not make (and always in a build without CUDA).
struct CudaPlacement {
  int index = 0;
  CudaStream stream = nullptr;
};
CudaPlacement cuda_placement(Device& device);

}  // namespace backend
