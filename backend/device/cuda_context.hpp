// CudaContext: what an op's CUDA twin needs from the CUDA device it runs on, without a CUDA
// header: the GPU (the runtime's index), the device's one stream, its cuBLASLt products
// (device/gemm_plans.cuh: the handle, the workspace and the plans) and its settings. The device
// owns all of it and outlives every context it hands out (Device::cuda_context).
#pragma once

#include "backend/core/cuda_stream.hpp"

namespace backend::cuda {
class GemmPlans;  // device/gemm_plans.cuh, for .cu files
}  // namespace backend::cuda

namespace backend {

struct CudaContext {
  int index = 0;
  CudaStream stream = nullptr;
  cuda::GemmPlans* gemm_plans = nullptr;
  // bf16 and fp16 attention on tensor cores where the head dimension fits
  // (CudaDeviceOptions::flash_attention, ops/attention.hpp).
  bool flash_attention = false;
};

}  // namespace backend
