// CPU twin of linear.hpp: OpenBLAS GEMMs for the products, column chunks for the bias sum.
#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/linear.hpp"

namespace backend::cpu {

using detail::Transpose;

template <typename Scalar>
void linear_forward(Scalar* output, const Scalar* input, const Scalar* weight,
                    const std::type_identity_t<Scalar>* bias, int64_t rows, int64_t in_features,
                    int64_t out_features) {
  Scalar beta = 0;
  if (bias != nullptr) {
    // Seed the output with the bias and let the GEMM add onto it (beta = 1): one pass over
    // the output instead of a second one after the product.
#pragma omp parallel for if (rows * out_features > detail::kParallelWork)
    for (int64_t row = 0; row < rows; ++row) {
      Scalar* out = output + row * out_features;
      for (int64_t o = 0; o < out_features; ++o) out[o] = bias[o];
    }
    beta = 1;
  }
  // output (N, OUT) = input (N, IN) · weight^T (IN, OUT)
  detail::gemm(Transpose::no, Transpose::yes, rows, out_features, in_features, Scalar{1}, input,
               in_features, weight, in_features, beta, output, out_features);
}

template <typename Scalar>
void linear_backward(std::type_identity_t<Scalar>* dinput, Scalar* dweight,
                     std::type_identity_t<Scalar>* dbias, const Scalar* doutput,
                     const Scalar* input, const Scalar* weight, int64_t rows, int64_t in_features,
                     int64_t out_features) {
  if (dinput != nullptr) {
    // dinput (N, IN) = doutput (N, OUT) · weight (OUT, IN)
    detail::gemm(Transpose::no, Transpose::no, rows, in_features, out_features, Scalar{1}, doutput,
                 out_features, weight, in_features, Scalar{0}, dinput, in_features);
  }
  // dweight (OUT, IN) += doutput^T (OUT, N) · input (N, IN)
  detail::gemm(Transpose::yes, Transpose::no, out_features, in_features, rows, Scalar{1}, doutput,
               out_features, input, in_features, Scalar{1}, dweight, in_features);
  if (dbias == nullptr) return;
  detail::add_column_sums<1>(std::array{dbias}, rows, out_features,
                             rows * out_features > detail::kParallelWork,
                             [&](int64_t row, int64_t begin, int64_t end, auto& sums) {
                               const Scalar* dy = doutput + row * out_features;
                               for (int64_t o = begin; o < end; ++o) sums[0][o - begin] += dy[o];
                             });
}

#define BACKEND_INSTANTIATE_LINEAR(Scalar)                                                       \
  template void linear_forward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*,     \
                                       int64_t, int64_t, int64_t);                               \
  template void linear_backward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*, const Scalar*, \
                                        const Scalar*, int64_t, int64_t, int64_t);
BACKEND_INSTANTIATE_LINEAR(float)
BACKEND_INSTANTIATE_LINEAR(double)
#undef BACKEND_INSTANTIATE_LINEAR

}  // namespace backend::cpu
