// rmsnorm.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/rmsnorm.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void rmsnorm_forward(Device& device, View output, View rstd, View input, View weight,
                     double epsilon, int64_t rows, int64_t channels, ResidualViews residual) {
  constexpr const char* op = "rmsnorm_forward";
  check_residual_views(input, residual, op);
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::rmsnorm_forward(host<S>(output), host<S>(rstd), host<S>(input), host<S>(weight),
                             static_cast<S>(epsilon), rows, channels,
                             host_residual<S>(input, residual));
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::rmsnorm_forward(gpu<S>(output, op), gpu<float>(rstd, op), gpu<S>(input, op),
                              gpu<S>(weight, op), static_cast<float>(epsilon), rows, channels,
                              context.stream, gpu_residual<S>(input, residual, op));
      });
}

void rmsnorm_backward(Device& device, View dinput, View dweight, View doutput, View input,
                      View weight, View rstd, int64_t rows, int64_t channels, InputGradient mode) {
  constexpr const char* op = "rmsnorm_backward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::rmsnorm_backward(host<S>(dinput), host<S>(dweight), host<S>(doutput), host<S>(input),
                              host<S>(weight), host<S>(rstd), rows, channels, mode);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        auto* scratch = static_cast<float*>(device.scratch(
            cuda::rmsnorm_backward_scratch_floats(rows, channels) * int64_t{sizeof(float)},
            op));
        cuda::rmsnorm_backward(gpu<S>(dinput, op), gpu<float>(dweight, op), gpu<S>(doutput, op),
                               gpu<S>(input, op), gpu<S>(weight, op), gpu<float>(rstd, op), rows,
                               channels, scratch, context.stream, mode);
      });
}

}  // namespace backend::ops
