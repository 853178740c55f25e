// dropout.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/dropout.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void dropout_forward(Device& device, View output, View input, const Dropout& dropout) {
  constexpr const char* op = "dropout_forward";
  run_typed(
      device, op, 0, input.type,
      [&](auto s) {
        using S = decltype(s);
        cpu::dropout_forward(host<S>(output), host<S>(input), input.numel, dropout);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::dropout_forward(gpu<S>(output, op), gpu<S>(input, op), input.numel, dropout,
                              context.stream);
      });
}

void dropout_backward(Device& device, View dinput, View doutput, const Dropout& dropout) {
  constexpr const char* op = "dropout_backward";
  run_typed(
      device, op, 0, doutput.type,
      [&](auto s) {
        using S = decltype(s);
        cpu::dropout_backward(host<S>(dinput), host<S>(doutput), doutput.numel, dropout);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::dropout_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), doutput.numel, dropout,
                               context.stream);
      });
}

}  // namespace backend::ops
