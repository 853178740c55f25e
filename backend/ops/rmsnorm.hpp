// Root-mean-square normalisation over the last dimension (Zhang & Sennrich 2019), Megatron's
// --normalization RMSNorm (megatron/legacy/model/rms_norm.py; torch.nn.RMSNorm in core's local
// spec): no centring, no bias.
//   rstd_i = 1 / sqrt(Σ_c x[i, c]² / C + epsilon),   x̂[i, c] = x[i, c] · rstd_i
//   y[i, c] = x̂[i, c] · weight[c]
// Forward stores rstd per row for the backward. Backward, with g = dy · weight (the LayerNorm
// backward without its mean terms, since nothing was subtracted):
//   dx[i, c]    = rstd_i · (g[i, c] − x̂[i, c] · mean_c(g[i, :] · x̂[i, :]))
//   dweight[c] += Σ_i dy[i, c] · x̂[i, c]
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=), unless the
// backward is asked to add dinput; the forward may start with the residual connection, as
// layernorm.hpp's (norm_kind.hpp's ResidualAdd and InputGradient).
// Column sums run in row order per column, so results do not depend on the thread count.
// Dimensions: N rows (B·T), C channels.
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"
#include "backend/ops/norm_kind.hpp"

namespace backend::cpu {

template <typename Scalar>
void rmsnorm_forward(Scalar* output,        // (N, C)
                     Scalar* rstd,          // (N)
                     const Scalar* input,   // (N, C)
                     const Scalar* weight,  // (C)
                     Scalar epsilon, int64_t rows, int64_t channels,
                     ResidualAdd<Scalar> residual = {});  // input = residual + branch first

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput,         // (N, C) = or += (mode)
                      Scalar* dweight,        // (C)    +=
                      const Scalar* doutput,  // (N, C)
                      const Scalar* input,    // (N, C)
                      const Scalar* weight,   // (C)
                      const Scalar* rstd,     // (N) from the forward
                      int64_t rows, int64_t channels,
                      InputGradient mode = InputGradient::overwrite);

}  // namespace backend::cpu

// The CUDA twin (rmsnorm_cuda.cu), Scalar float, bfloat16 or float16, computed in float. rstd and
// dweight (the fp32 main grad) are float whatever Scalar is. dweight is a column sum without
// atomics: per-group partial sums go to `scratch` (rmsnorm_backward_scratch_floats(rows,
// channels) floats of device memory, owned by the caller, contents free on entry and on exit),
// then are added in a fixed order, so a run repeats its bits. dinput may alias doutput.
namespace backend::cuda {

template <typename Scalar>
void rmsnorm_forward(Scalar* output,        // (N, C)
                     float* rstd,           // (N)
                     const Scalar* input,   // (N, C)
                     const Scalar* weight,  // (C)
                     float epsilon, int64_t rows, int64_t channels, CudaStream stream,
                     ResidualAdd<Scalar> residual = {});

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t channels);

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput,         // (N, C) =
                      float* dweight,         // (C)    +=
                      const Scalar* doutput,  // (N, C)
                      const Scalar* input,    // (N, C)
                      const Scalar* weight,   // (C)
                      const float* rstd,      // (N) from the forward
                      int64_t rows, int64_t channels,
                      float* scratch,  // rmsnorm_backward_scratch_floats(rows, channels)
                      CudaStream stream, InputGradient mode = InputGradient::overwrite);

}  // namespace backend::cuda

// The ops on `device`'s memory: fp32 or fp64 on the CPU (rstd of the input's type); fp32, bf16
// or fp16 on a GPU (rstd and dweight fp32; the backward's column partial sums in the device's
// scratch).
namespace backend::ops {

void rmsnorm_forward(Device& device, View output, View rstd, View input, View weight,
                     double epsilon, int64_t rows, int64_t channels, ResidualViews residual = {});
void rmsnorm_backward(Device& device, View dinput, View dweight, View doutput, View input,
                      View weight, View rstd, int64_t rows, int64_t channels,
                      InputGradient mode = InputGradient::overwrite);

}  // namespace backend::ops
