// The CUDA stream type without a CUDA header: cudaStream_t is `struct CUstream_st*`, so the
// CUDA op twins' declarations in backend/ops/*.hpp can name it and host code can include them
// (the seam's first never: no CUDA header in a .hpp).
#pragma once

struct CUstream_st;

namespace backend {
using CudaStream = CUstream_st*;
}  // namespace backend
