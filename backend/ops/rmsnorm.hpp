// Root-mean-square normalisation over the last dimension (Zhang & Sennrich 2019), Megatron's
// --normalization RMSNorm (megatron/legacy/model/rms_norm.py; torch.nn.RMSNorm in core's local
// spec): no centring, no bias.
//   rstd_i = 1 / sqrt(Σ_c x[i, c]² / C + epsilon),   x̂[i, c] = x[i, c] · rstd_i
//   y[i, c] = x̂[i, c] · weight[c]
// Forward stores rstd per row for the backward. Backward, with g = dy · weight (the LayerNorm
// backward without its mean terms, since nothing was subtracted):
//   dx[i, c]    = rstd_i · (g[i, c] − x̂[i, c] · mean_c(g[i, :] · x̂[i, :]))
//   dweight[c] += Σ_i dy[i, c] · x̂[i, c]
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Column sums run in row order per column, so results do not depend on the thread count.
// Dimensions: N rows (B·T), C channels.
#pragma once

#include <cstdint>

namespace backend::cpu {

template <typename Scalar>
void rmsnorm_forward(Scalar* output,        // (N, C)
                     Scalar* rstd,          // (N)
                     const Scalar* input,   // (N, C)
                     const Scalar* weight,  // (C)
                     Scalar epsilon, int64_t rows, int64_t channels);

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput,         // (N, C) =
                      Scalar* dweight,        // (C)    +=
                      const Scalar* doutput,  // (N, C)
                      const Scalar* input,    // (N, C)
                      const Scalar* weight,   // (C)
                      const Scalar* rstd,     // (N) from the forward
                      int64_t rows, int64_t channels);

}  // namespace backend::cpu
