// Layer normalisation over the last dimension (Ba, Kiros & Hinton 2016; Megatron core's
// FusedLayerNorm / torch.nn.LayerNorm with elementwise affine; llm.c's layernorm_*):
//   mean_i = Σ_c x[i, c] / C,   var_i = Σ_c (x[i, c] − mean_i)² / C   (biased, as torch)
//   rstd_i = 1 / sqrt(var_i + epsilon),   x̂[i, c] = (x[i, c] − mean_i) · rstd_i
//   y[i, c] = x̂[i, c] · weight[c] + bias[c]
// Forward stores mean and rstd per row for the backward. Backward, with g = dy · weight:
//   dx[i, c]     = rstd_i · (g[i, c] − mean_c(g[i, :]) − x̂[i, c] · mean_c(g[i, :] · x̂[i, :]))
//   dweight[c]  += Σ_i dy[i, c] · x̂[i, c]
//   dbias[c]    += Σ_i dy[i, c]
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Column sums run in row order per column, so results do not depend on the thread count.
// Dimensions: N rows (B·T), C channels.
#pragma once

#include <cstdint>

namespace backend::cpu {

template <typename Scalar>
void layernorm_forward(Scalar* output,        // (N, C)
                       Scalar* mean,          // (N)
                       Scalar* rstd,          // (N)
                       const Scalar* input,   // (N, C)
                       const Scalar* weight,  // (C)
                       const Scalar* bias,    // (C)
                       Scalar epsilon, int64_t rows, int64_t channels);

template <typename Scalar>
void layernorm_backward(Scalar* dinput,         // (N, C) =
                        Scalar* dweight,        // (C)    +=
                        Scalar* dbias,          // (C)    +=
                        const Scalar* doutput,  // (N, C)
                        const Scalar* input,    // (N, C)
                        const Scalar* weight,   // (C)
                        const Scalar* mean,     // (N) from the forward
                        const Scalar* rstd,     // (N) from the forward
                        int64_t rows, int64_t channels);

}  // namespace backend::cpu
