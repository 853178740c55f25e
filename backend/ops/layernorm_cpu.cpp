// CPU twin of layernorm.hpp: norm_rows_cpu.hpp's row loops (shared with rmsnorm_cpu.cpp) for
// LayerNorm.
#include "backend/ops/layernorm.hpp"
#include "backend/ops/norm_rows_cpu.hpp"

namespace backend::cpu {

template <typename Scalar>
void layernorm_forward(Scalar* output, Scalar* mean, Scalar* rstd, const Scalar* input,
                       const Scalar* weight, const Scalar* bias, Scalar weight_offset,
                       Scalar epsilon, int64_t rows, int64_t channels,
                       ResidualAdd<Scalar> residual) {
  detail::norm_forward<NormKind::layer_norm>(output, mean, rstd, input, weight, bias, weight_offset,
                                             epsilon, rows, channels, residual);
}

template <typename Scalar>
void layernorm_backward(Scalar* dinput, Scalar* dweight, Scalar* dbias, const Scalar* doutput,
                        const Scalar* input, const Scalar* weight, Scalar weight_offset,
                        const Scalar* mean, const Scalar* rstd, int64_t rows, int64_t channels,
                        InputGradient mode) {
  detail::norm_backward<NormKind::layer_norm>(dinput, dweight, dbias, doutput, input, weight,
                                              weight_offset, mean, rstd, rows, channels, mode);
}

#define BACKEND_INSTANTIATE_LAYERNORM(Scalar)                                                      \
  template void layernorm_forward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*, const Scalar*, \
                                          const Scalar*, Scalar, Scalar, int64_t, int64_t,         \
                                          ResidualAdd<Scalar>);                                    \
  template void layernorm_backward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*,               \
                                           const Scalar*, const Scalar*, Scalar, const Scalar*,    \
                                           const Scalar*, int64_t, int64_t, InputGradient);
BACKEND_INSTANTIATE_LAYERNORM(float)
BACKEND_INSTANTIATE_LAYERNORM(double)
#undef BACKEND_INSTANTIATE_LAYERNORM

}  // namespace backend::cpu
