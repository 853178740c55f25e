// The CUDA device's factory (cuda_device.cu when the build has CUDA, cuda_device_nocuda.cpp
// otherwise): the one place host code gets a GPU Device. The device owns its stream, its
// cuBLASLt handle and workspace (no global stream or handle), and checks every CUDA and cuBLAS
// call, naming the statement, file and line (cuda_check.cuh).
#pragma once

#include <memory>

#include "backend/device/device.hpp"

namespace backend {

// GPU `index` as the CUDA runtime numbers them (after CUDA_VISIBLE_DEVICES). common::Error if
// the build has no CUDA, the index does not exist or the device cannot be initialised.
std::unique_ptr<Device> make_cuda_device(int index);

}  // namespace backend
