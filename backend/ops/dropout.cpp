// dropout.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/dropout.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

namespace {

// Both directions multiply by the same mask and scale (dropout.hpp): the backward's
// dinput = doutput ∘ mask / (1 − p) is the forward applied to doutput, so one dispatch serves
// both, under each direction's op name.
void apply_mask(Device& device, const char* op, View output, View input, const Dropout& dropout) {
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::dropout_forward(host<S>(output), host<S>(input), input.numel, dropout);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::dropout_forward(gpu<S>(output, op), gpu<S>(input, op), input.numel, dropout,
                              context.stream);
      });
}

}  // namespace

void dropout_forward(Device& device, View output, View input, const Dropout& dropout) {
  apply_mask(device, "dropout_forward", output, input, dropout);
}

void dropout_backward(Device& device, View dinput, View doutput, const Dropout& dropout) {
  apply_mask(device, "dropout_backward", dinput, doutput, dropout);
}

}  // namespace backend::ops
