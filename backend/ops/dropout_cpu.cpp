// CPU twin of dropout.hpp: element i draws mask index dropout.first_index + i.
#include <algorithm>

#include "backend/ops/dropout.hpp"
#include "backend/ops/gemm_cpu.hpp"

namespace backend::cpu {

template <typename Scalar>
void dropout_forward(Scalar* output, const Scalar* input, int64_t count, const Dropout& dropout) {
  if (!dropout.active()) {
    if (output != input) std::copy_n(input, count, output);
    return;
  }
  const uint64_t key = dropout.key_in_force();
  const uint64_t first = dropout.first_index;
  const uint64_t threshold = dropout.threshold();
  const Scalar scale = dropout.scale<Scalar>();
#pragma omp parallel for if (count > detail::kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    // A multiplication by 0 rather than a 0, so a NaN or infinity still propagates (as
    // torch's input · mask · scale): the trainer's NaN check must not miss one.
    const bool keep = dropout_keep(key, first + static_cast<uint64_t>(i), threshold);
    output[i] = input[i] * (keep ? scale : Scalar{0});
  }
}

template <typename Scalar>
void dropout_backward(Scalar* dinput, const Scalar* doutput, int64_t count,
                      const Dropout& dropout) {
  // The same mask and scale: d(x · keep · scale)/dx = keep · scale.
  dropout_forward(dinput, doutput, count, dropout);
}

template void dropout_forward<float>(float*, const float*, int64_t, const Dropout&);
template void dropout_forward<double>(double*, const double*, int64_t, const Dropout&);
template void dropout_backward<float>(float*, const float*, int64_t, const Dropout&);
template void dropout_backward<double>(double*, const double*, int64_t, const Dropout&);

}  // namespace backend::cpu
