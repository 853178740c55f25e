// gelu.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/gelu.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void gelu_forward(Device& device, View output, View input) {
  constexpr const char* op = "gelu_forward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::gelu_forward(host<S>(output), host<S>(input), input.numel);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::gelu_forward(gpu<S>(output, op), gpu<S>(input, op), input.numel, context.stream);
      });
}

void gelu_backward(Device& device, View dinput, View doutput, View input) {
  constexpr const char* op = "gelu_backward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::gelu_backward(host<S>(dinput), host<S>(doutput), host<S>(input), input.numel);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::gelu_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<S>(input, op),
                            input.numel, context.stream);
      });
}

}  // namespace backend::ops
