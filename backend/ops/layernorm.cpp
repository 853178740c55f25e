// layernorm.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/layernorm.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void layernorm_forward(Device& device, View output, View mean, View rstd, View input, View weight,
                       View bias, double weight_offset, double epsilon, int64_t rows,
                       int64_t channels, ResidualViews residual) {
  constexpr const char* op = "layernorm_forward";
  check_residual_views(input, residual, op);
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::layernorm_forward(host<S>(output), host<S>(mean), host<S>(rstd), host<S>(input),
                               host<S>(weight), host<S>(bias), static_cast<S>(weight_offset),
                               static_cast<S>(epsilon), rows, channels,
                               host_residual<S>(input, residual));
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::layernorm_forward(gpu<S>(output, op), gpu<float>(mean, op), gpu<float>(rstd, op),
                                gpu<S>(input, op), gpu<S>(weight, op), gpu<S>(bias, op),
                                static_cast<float>(weight_offset), static_cast<float>(epsilon),
                                rows, channels, context.stream,
                                gpu_residual<S>(input, residual, op));
      });
}

void layernorm_backward(Device& device, View dinput, View dweight, View dbias, View doutput,
                        View input, View weight, double weight_offset, View mean, View rstd,
                        int64_t rows, int64_t channels, InputGradient mode) {
  constexpr const char* op = "layernorm_backward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::layernorm_backward(host<S>(dinput), host<S>(dweight), host<S>(dbias), host<S>(doutput),
                                host<S>(input), host<S>(weight), static_cast<S>(weight_offset),
                                host<S>(mean), host<S>(rstd), rows, channels, mode);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        auto* scratch = static_cast<float*>(device.scratch(
            cuda::layernorm_backward_scratch_floats(rows, channels) * int64_t{sizeof(float)},
            op));
        cuda::layernorm_backward(gpu<S>(dinput, op), gpu<float>(dweight, op), gpu<float>(dbias, op),
                                 gpu<S>(doutput, op), gpu<S>(input, op), gpu<S>(weight, op),
                                 static_cast<float>(weight_offset), gpu<float>(mean, op),
                                 gpu<float>(rstd, op), rows, channels, scratch, context.stream,
                                 mode);
      });
}

}  // namespace backend::ops
