// convert.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/convert.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void convert(Device& device, View destination, View source) {
  constexpr const char* op = "convert";
  check_convertible(destination, source, op);
  const bool to_fp16 = destination.type == ElementType::f16;
  run(
      device, op, 0,
      [&] {
        if (to_fp16) {
          cpu::convert(host<float16>(destination), host<float>(source), source.numel);
        } else {
          cpu::convert(host<bfloat16>(destination), host<float>(source), source.numel);
        }
      },
      [&](const auto& context) {
        if (to_fp16) {
          cuda::convert(gpu<float16>(destination, op), gpu<float>(source, op), source.numel,
                        context.stream);
        } else {
          cuda::convert(gpu<bfloat16>(destination, op), gpu<float>(source, op), source.numel,
                        context.stream);
        }
      });
}

}  // namespace backend::ops
