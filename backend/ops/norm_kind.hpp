// Which of the model's two norms a shared row kernel computes (norm_rows_cpu.hpp,
// norm_rows_cuda.cuh): LayerNorm centres the row (mean subtracted, the weight plus
// --apply-layernorm-1p's offset, a bias), RMSNorm does not (no mean, no bias).
#pragma once

namespace backend {

enum class NormKind { layer_norm, rms_norm };

}  // namespace backend
