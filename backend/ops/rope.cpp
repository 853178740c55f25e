// rope.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/rope.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void rope_tables(Device& device, View cos, View sin, int64_t seq_length, int64_t rotary_dim,
                 double base, RopeScaling scaling) {
  constexpr const char* op = "rope_tables";
  run(
      device, op, 0,
      [=] {
        host_scalar(cos.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::rope_tables(host<S>(cos), host<S>(sin), seq_length, rotary_dim, base, scaling);
        });
      },
      [&](const auto& context) {
        cuda::rope_tables(gpu<float>(cos, op), gpu<float>(sin, op), seq_length, rotary_dim, base,
                          scaling, context.stream);
      });
}

void rope_forward(Device& device, View output, View input, View cos, View sin,
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride) {
  constexpr const char* op = "rope_forward";
  run(
      device, op, 0,
      [=] {
        host_scalar(input.type, op, [&](auto s) {
          using S = decltype(s);
          cpu::rope_forward(host<S>(output), host<S>(input), host<S>(cos), host<S>(sin),
                            batch_size, seq_length, num_heads, head_dim, rotary_dim, row_stride);
        });
      },
      [&](const auto& context) {
        gpu_scalar(input.type, op, [&](auto s) {
          using S = decltype(s);
          cuda::rope_forward(gpu<S>(output, op), gpu<S>(input, op), gpu<float>(cos, op),
                             gpu<float>(sin, op), batch_size, seq_length, num_heads, head_dim,
                             rotary_dim, row_stride, context.stream);
        });
      });
}

void rope_backward(Device& device, View dinput, View doutput, View cos, View sin,
                   int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride) {
  constexpr const char* op = "rope_backward";
  run_typed(
      device, op, 0, doutput.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::rope_backward(host<S>(dinput), host<S>(doutput), host<S>(cos), host<S>(sin),
                           batch_size, seq_length, num_heads, head_dim, rotary_dim,
                           row_stride);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::rope_backward(gpu<S>(dinput, op), gpu<S>(doutput, op), gpu<float>(cos, op),
                            gpu<float>(sin, op), batch_size, seq_length, num_heads, head_dim,
                            rotary_dim, row_stride, context.stream);
      });
}

void rope_at_positions_forward(Device& device, View output, View input, View cos, View sin,
                               View positions, int64_t rows, int64_t num_heads,
                               int64_t head_dim, int64_t rotary_dim, int64_t row_stride) {
  constexpr const char* op = "rope_at_positions_forward";
  run_typed(
      device, op, 0, input.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::rope_at_positions_forward(host<S>(output), host<S>(input), host<S>(cos),
                                       host<S>(sin), host_ids(positions), rows, num_heads,
                                       head_dim, rotary_dim, row_stride);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::rope_at_positions_forward(gpu<S>(output, op), gpu<S>(input, op),
                                        gpu<float>(cos, op), gpu<float>(sin, op),
                                        gpu_ids(positions, op), rows, num_heads, head_dim,
                                        rotary_dim, row_stride, context.stream);
      });
}

}  // namespace backend::ops
