// CPU twin of linear_gelu.hpp: linear.hpp's twin, then gelu.hpp's, so the fused op gives the
// bits of the two ops called in turn (GELU's backward in place over dh).
#include "backend/ops/gelu.hpp"
#include "backend/ops/linear.hpp"
#include "backend/ops/linear_gelu.hpp"

namespace backend::cpu {

template <typename Scalar>
void linear_gelu_forward(Scalar* activation, Scalar* preactivation, const Scalar* input,
                         const Scalar* weight, const std::type_identity_t<Scalar>* bias,
                         int64_t rows, int64_t in_features, int64_t out_features) {
  linear_forward(preactivation, input, weight, bias, rows, in_features, out_features);
  gelu_forward(activation, preactivation, rows * out_features);
}

template <typename Scalar>
void linear_dgelu_backward(std::type_identity_t<Scalar>* dpreactivation, Scalar* dweight,
                           std::type_identity_t<Scalar>* dbias, const Scalar* doutput,
                           const Scalar* activation, const Scalar* weight,
                           const Scalar* preactivation, int64_t rows, int64_t in_features,
                           int64_t out_features) {
  // fc2's input gradient is da = dy · W2, written into dh's buffer, then turned into dh.
  linear_backward(dpreactivation, dweight, dbias, doutput, activation, weight, rows, in_features,
                  out_features);
  gelu_backward(dpreactivation, dpreactivation, preactivation, rows * in_features);
}

#define BACKEND_INSTANTIATE_LINEAR_GELU(Scalar)                                             \
  template void linear_gelu_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const Scalar*, \
                                            const Scalar*, int64_t, int64_t, int64_t);      \
  template void linear_dgelu_backward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*,     \
                                              const Scalar*, const Scalar*, const Scalar*,  \
                                              int64_t, int64_t, int64_t);
BACKEND_INSTANTIATE_LINEAR_GELU(float)
BACKEND_INSTANTIATE_LINEAR_GELU(double)
#undef BACKEND_INSTANTIATE_LINEAR_GELU

}  // namespace backend::cpu
