// swiglu.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/swiglu.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void swiglu_forward(Device& device, View output, View input, int64_t rows, int64_t features) {
  constexpr const char* op = "swiglu_forward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::swiglu_forward(host<S>(output), host<S>(input), rows, features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::swiglu_forward(gpu<S>(output, op), gpu<S>(input, op), rows, features,
                             context.stream);
      });
}

void swiglu_backward(Device& device, View dinput, View doutput, View input, int64_t rows,
                     int64_t features) {
  constexpr const char* op = "swiglu_backward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::swiglu_backward(host<S>(dinput), host<S>(doutput), host<S>(input), rows,
                             features);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::swiglu_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<S>(input, op),
                              rows, features, context.stream);
      });
}

}  // namespace backend::ops
