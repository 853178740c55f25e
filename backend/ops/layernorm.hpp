// Layer normalisation over the last dimension (Ba, Kiros & Hinton 2016; Megatron core's
// FusedLayerNorm / torch.nn.LayerNorm with elementwise affine; llm.c's layernorm_*):
//   mean_i = Σ_c x[i, c] / C,   var_i = Σ_c (x[i, c] − mean_i)² / C   (biased, as torch)
//   rstd_i = 1 / sqrt(var_i + epsilon),   x̂[i, c] = (x[i, c] − mean_i) · rstd_i
//   y[i, c] = x̂[i, c] · (weight[c] + weight_offset) + bias[c]
// weight_offset is 0, or 1 for Megatron's --apply-layernorm-1p (apex's zero-centered gamma:
// the stored weight is γ − 1, initialised to 0, so weight decay pulls γ towards 1, not 0).
// Forward stores mean and rstd per row for the backward. Backward, with
// g = dy · (weight + weight_offset):
//   dx[i, c]     = rstd_i · (g[i, c] − mean_c(g[i, :]) − x̂[i, c] · mean_c(g[i, :] · x̂[i, :]))
//   dweight[c]  += Σ_i dy[i, c] · x̂[i, c]
//   dbias[c]    += Σ_i dy[i, c]
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=), unless the
// backward is asked to add dinput (InputGradient::accumulate: the fused residual connection's
// backward). The forward may start with the residual connection, input = residual + branch
// (norm_kind.hpp's ResidualAdd), one kernel where a pre-norm block had two.
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
void layernorm_forward(Scalar* output,        // (N, C)
                       Scalar* mean,          // (N)
                       Scalar* rstd,          // (N)
                       const Scalar* input,   // (N, C)
                       const Scalar* weight,  // (C)
                       const Scalar* bias,    // (C)
                       Scalar weight_offset, Scalar epsilon, int64_t rows, int64_t channels,
                       ResidualAdd<Scalar> residual = {});  // input = residual + branch first

template <typename Scalar>
void layernorm_backward(Scalar* dinput,         // (N, C) = or += (mode)
                        Scalar* dweight,        // (C)    +=
                        Scalar* dbias,          // (C)    +=
                        const Scalar* doutput,  // (N, C)
                        const Scalar* input,    // (N, C)
                        const Scalar* weight,   // (C)
                        Scalar weight_offset,
                        const Scalar* mean,  // (N) from the forward
                        const Scalar* rstd,  // (N) from the forward
                        int64_t rows, int64_t channels,
                        InputGradient mode = InputGradient::overwrite);

}  // namespace backend::cpu

// The CUDA twin (layernorm_cuda.cu), Scalar float, bfloat16 or float16, computed in float.
// Statistics (mean, rstd) and parameter gradients (dweight, dbias: fp32 main grads) are float
// whatever Scalar is. dweight/dbias are column sums without atomics: per-group partial sums go to
// `scratch` (layernorm_backward_scratch_floats(rows, channels) floats of device memory, owned by
// the caller, contents free on entry and on exit), then are added in a fixed order, so a run
// repeats its bits. dinput may alias doutput.
namespace backend::cuda {

template <typename Scalar>
void layernorm_forward(Scalar* output,        // (N, C)
                       float* mean,           // (N)
                       float* rstd,           // (N)
                       const Scalar* input,   // (N, C)
                       const Scalar* weight,  // (C)
                       const Scalar* bias,    // (C)
                       float weight_offset, float epsilon, int64_t rows, int64_t channels,
                       CudaStream stream, ResidualAdd<Scalar> residual = {});

int64_t layernorm_backward_scratch_floats(int64_t rows, int64_t channels);

template <typename Scalar>
void layernorm_backward(Scalar* dinput,         // (N, C) =
                        float* dweight,         // (C)    +=
                        float* dbias,           // (C)    +=
                        const Scalar* doutput,  // (N, C)
                        const Scalar* input,    // (N, C)
                        const Scalar* weight,   // (C)
                        float weight_offset,
                        const float* mean,  // (N) from the forward
                        const float* rstd,  // (N) from the forward
                        int64_t rows, int64_t channels,
                        float* scratch,  // layernorm_backward_scratch_floats(rows, channels)
                        CudaStream stream, InputGradient mode = InputGradient::overwrite);

}  // namespace backend::cuda

// The ops on `device`'s memory: fp32 or fp64 on the CPU (statistics of the input's type);
// fp32, bf16 or fp16 on a GPU (statistics and parameter gradients fp32; the backward's column
// partial sums in the device's scratch).
namespace backend::ops {

void layernorm_forward(Device& device, View output, View mean, View rstd, View input, View weight,
                       View bias, double weight_offset, double epsilon, int64_t rows,
                       int64_t channels, ResidualViews residual = {});
void layernorm_backward(Device& device, View dinput, View dweight, View dbias, View doutput,
                        View input, View weight, double weight_offset, View mean, View rstd,
                        int64_t rows, int64_t channels,
                        InputGradient mode = InputGradient::overwrite);

}  // namespace backend::ops
