// CPU twin of rmsnorm.hpp: norm_rows_cpu.hpp's row loops (shared with layernorm_cpu.cpp) for
// RMSNorm.
#include "backend/ops/norm_rows_cpu.hpp"
#include "backend/ops/rmsnorm.hpp"

namespace backend::cpu {

template <typename Scalar>
void rmsnorm_forward(Scalar* output, Scalar* rstd, const Scalar* input, const Scalar* weight,
                     Scalar epsilon, int64_t rows, int64_t channels, ResidualAdd<Scalar> residual) {
  detail::norm_forward<NormKind::rms_norm>(output, static_cast<Scalar*>(nullptr), rstd, input,
                                           weight, static_cast<const Scalar*>(nullptr), Scalar{0},
                                           epsilon, rows, channels, residual);
}

template <typename Scalar>
void rmsnorm_backward(Scalar* dinput, Scalar* dweight, const Scalar* doutput, const Scalar* input,
                      const Scalar* weight, const Scalar* rstd, int64_t rows, int64_t channels,
                      InputGradient mode) {
  detail::norm_backward<NormKind::rms_norm>(
      dinput, dweight, static_cast<Scalar*>(nullptr), doutput, input, weight, Scalar{0},
      static_cast<const Scalar*>(nullptr), rstd, rows, channels, mode);
}

#define BACKEND_INSTANTIATE_RMSNORM(Scalar)                                                     \
  template void rmsnorm_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*, Scalar, \
                                        int64_t, int64_t, ResidualAdd<Scalar>);                 \
  template void rmsnorm_backward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*,        \
                                         const Scalar*, const Scalar*, int64_t, int64_t,        \
                                         InputGradient);
BACKEND_INSTANTIATE_RMSNORM(float)
BACKEND_INSTANTIATE_RMSNORM(double)
#undef BACKEND_INSTANTIATE_RMSNORM

}  // namespace backend::cpu
