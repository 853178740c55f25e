// residual.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/residual.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void residual_forward(Device& device, View output, View input, View branch) {
  constexpr const char* op = "residual_forward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::residual_forward(host<S>(output), host<S>(input), host<S>(branch), input.numel);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::residual_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<S>(branch, op),
                               input.numel, context.stream);
      });
}

}  // namespace backend::ops
