// Which of the model's two norms a shared row kernel computes (norm_rows_cpu.hpp,
// norm_rows_cuda.cuh): LayerNorm centres the row (mean subtracted, the weight plus
// --apply-layernorm-1p's offset, a bias), RMSNorm does not (no mean, no bias).
#pragma once

#include "backend/core/view.hpp"

namespace backend {

enum class NormKind { layer_norm, rms_norm };

// The residual connection a norm's forward may start with (a pre-norm block's x + f(x) fused
// with the next norm, one pass over the row instead of two kernels):
//   sum = residual + branch, rounded to the element type, then norm(sum)
// sum is the norm's input (the twin's `input` argument must be sum), kept for the backward and
// the next residual connection; it may be neither residual nor branch.
template <typename T>
struct ResidualAdd {
  T* sum = nullptr;
  const T* residual = nullptr;
  const T* branch = nullptr;
  bool active() const { return sum != nullptr; }
};

// The ops' form (layernorm.hpp, rmsnorm.hpp): the views of residual and branch; empty, no
// residual connection. The op's `input` view is the sum.
struct ResidualViews {
  View residual;
  View branch;
  bool active() const { return !residual.empty(); }
};

// How a norm's backward writes dinput: overwritten, or added to what is there (the residual
// stream's gradient: the backward of the fused residual connection, whose sum's gradient flows
// on unchanged and gains the norm's).
enum class InputGradient { overwrite, accumulate };

}  // namespace backend
