// convert.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/convert.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void convert(Device& device, View destination, View source) {
  constexpr const char* op = "convert";
  check_convertible(destination, source, op);
  // One of four pairs: fp32 → bf16 or fp16, or back.
  const bool narrowing = source.type == ElementType::f32;
  const bool fp16 = (narrowing ? destination.type : source.type) == ElementType::f16;
  run(
      device, op, 0,
      [=] {
        if (narrowing && fp16) {
          cpu::convert(host<float16>(destination), host<float>(source), source.numel);
        } else if (narrowing) {
          cpu::convert(host<bfloat16>(destination), host<float>(source), source.numel);
        } else if (fp16) {
          cpu::convert(host<float>(destination), host<float16>(source), source.numel);
        } else {
          cpu::convert(host<float>(destination), host<bfloat16>(source), source.numel);
        }
      },
      [&](const auto& context) {
        if (narrowing && fp16) {
          cuda::convert(gpu<float16>(destination, op), gpu<float>(source, op), source.numel,
                        context.stream);
        } else if (narrowing) {
          cuda::convert(gpu<bfloat16>(destination, op), gpu<float>(source, op), source.numel,
                        context.stream);
        } else if (fp16) {
          cuda::convert(gpu<float>(destination, op), gpu<float16>(source, op), source.numel,
                        context.stream);
        } else {
          cuda::convert(gpu<float>(destination, op), gpu<bfloat16>(source, op), source.numel,
                        context.stream);
        }
      });
}

}  // namespace backend::ops
