// linear_gelu.hpp's ops over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/linear_gelu.hpp"

#include "backend/ops/dispatch.hpp"
#include "backend/ops/linear.hpp"

namespace backend::ops {

using namespace detail;

void linear_gelu_forward(Device& device, View activation, View preactivation, View input,
                         View weight, View bias, int64_t rows, int64_t in_features,
                         int64_t out_features) {
  constexpr const char* op = "linear_gelu_forward";
  const double flops = linear_product_flops(rows, in_features, out_features);
  run_typed(
      device, op, flops, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::linear_gelu_forward(host<S>(activation), host<S>(preactivation), host<S>(input),
                                 host<S>(weight), host<S>(bias), rows, in_features, out_features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::linear_gelu_forward(gpu<S>(activation, op), gpu<S>(preactivation, op),
                                  gpu<S>(input, op), gpu<S>(weight, op), gpu<S>(bias, op), rows,
                                  in_features, out_features, *context.gemm_plans, context.stream);
      });
}

void linear_dgelu_backward(Device& device, View dpreactivation, View dweight, View dbias,
                           View doutput, View activation, View weight, View preactivation,
                           int64_t rows, int64_t in_features, int64_t out_features) {
  constexpr const char* op = "linear_dgelu_backward";
  const double flops = 2.0 * linear_product_flops(rows, in_features, out_features);
  run_typed(
      device, op, flops, activation.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::linear_dgelu_backward(host<S>(dpreactivation), host<S>(dweight), host<S>(dbias),
                                   host<S>(doutput), host<S>(activation), host<S>(weight),
                                   host<S>(preactivation), rows, in_features, out_features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::linear_dgelu_backward(
            gpu<S>(dpreactivation, op), gpu<float>(dweight, op), gpu<float>(dbias, op),
            gpu<S>(doutput, op), gpu<S>(activation, op), gpu<S>(weight, op),
            gpu<S>(preactivation, op), rows, in_features, out_features, *context.gemm_plans,
            linear_backward_scratch(device, dbias, rows, out_features, op), context.stream);
      });
}

}  // namespace backend::ops
