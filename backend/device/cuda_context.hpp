// CudaContext: what an op's CUDA twin needs from the CUDA device it runs on, without a CUDA
// header: the GPU (the runtime's index), the device's one stream, its cuBLASLt products
// (device/gemm_plans.cuh: the handle, the workspace and the plans), its cuDNN plans
// (device/cudnn_graph.cuh) and its settings. The device owns all of it and
// outlives every context it hands out (Device::cuda_context).
#pragma once

#include <cstdint>
#include <span>

#include "backend/common/enum_names.hpp"
#include "backend/core/cuda_stream.hpp"

namespace backend::cuda {
class GemmPlans;   // device/gemm_plans.cuh, for .cu files
class CudnnPlans;  // device/cudnn_graph.cuh, for .cu files
}  // namespace backend::cuda

namespace backend {

// Which kernels compute attention on a CUDA device: Megatron core's --attention-backend, with
// this project's kernels in the places of Transformer Engine's and PyTorch's
// (ops/attention.hpp; docs/cudnn_attention.md):
//   fused    cuDNN's fused flash attention (Transformer Engine's FusedAttention is cuDNN's);
//            a call cuDNN cannot run is an error naming why
//   flash    our tensor-core kernel (attention_flash_cuda.cu) for bf16/fp16 at head dimensions
//            64 and 128, the CUDA-core kernel otherwise (what --use-flash-attn selected)
//   unfused, local   the CUDA-core kernel (attention_cuda.cu) for every call
//   auto     cuDNN where it runs the call, else as flash; each distinct reason cuDNN was
//            passed over is logged once
enum class AttentionBackend { automatic, fused, flash, unfused, local };
constexpr common::EnumName<AttentionBackend> kAttentionBackendNames[] = {
    {AttentionBackend::flash, "flash"},
    {AttentionBackend::fused, "fused"},
    {AttentionBackend::unfused, "unfused"},
    {AttentionBackend::local, "local"},
    {AttentionBackend::automatic, "auto"}};
constexpr std::span<const common::EnumName<AttentionBackend>> enum_names(AttentionBackend) {
  return kAttentionBackendNames;
}
// Whether `backend` asks cuDNN first (fused, auto): the device then makes cuDNN plans.
constexpr bool uses_cudnn(AttentionBackend backend) {
  return backend == AttentionBackend::fused || backend == AttentionBackend::automatic;
}

struct CudaContext {
  int index = 0;
  CudaStream stream = nullptr;
  cuda::GemmPlans* gemm_plans = nullptr;
  // Made when attention_backend may use cuDNN and cuDNN loaded; nullptr otherwise.
  cuda::CudnnPlans* cudnn_plans = nullptr;
  AttentionBackend attention_backend = AttentionBackend::local;
};

}  // namespace backend
