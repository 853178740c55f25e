// linear.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/linear.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void linear_forward(Device& device, View output, View input, View weight, View bias,
                    int64_t rows, int64_t in_features, int64_t out_features) {
  constexpr const char* op = "linear_forward";
  const double flops = linear_product_flops(rows, in_features, out_features);
  run_typed(
      device, op, flops, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::linear_forward(host<S>(output), host<S>(input), host<S>(weight), host<S>(bias),
                            rows, in_features, out_features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::linear_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<S>(weight, op),
                             gpu<S>(bias, op), rows, in_features, out_features,
                             *context.gemm_plans, context.stream);
      });
}

void linear_backward(Device& device, View dinput, View dweight, View dbias, View doutput,
                     View input, View weight, int64_t rows, int64_t in_features,
                     int64_t out_features) {
  constexpr const char* op = "linear_backward";
  const double flops =
      (dinput.empty() ? 1.0 : 2.0) * linear_product_flops(rows, in_features, out_features);
  run_typed(
      device, op, flops, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::linear_backward(host<S>(dinput), host<S>(dweight), host<S>(dbias),
                             host<S>(doutput), host<S>(input), host<S>(weight), rows,
                             in_features, out_features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::linear_backward(gpu<S>(dinput, op), gpu<float>(dweight, op), gpu<float>(dbias, op),
                              gpu<S>(doutput, op), gpu<S>(input, op), gpu<S>(weight, op), rows,
                              in_features, out_features, *context.gemm_plans,
                              linear_backward_scratch(device, dbias, rows, out_features, op),
                              context.stream);
      });
}

float* linear_backward_scratch(Device& device, View dbias, int64_t rows, int64_t out_features,
                               const char* op) {
  if constexpr (kBuiltWithCuda) {
    if (dbias.empty()) return nullptr;
    return static_cast<float*>(device.scratch(
        cuda::linear_backward_scratch_floats(rows, out_features) * int64_t{sizeof(float)}, op));
  } else {
    return nullptr;
  }
}

}  // namespace backend::ops
