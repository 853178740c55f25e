// reduction.hpp's op over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/reduction.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

namespace {

enum class Reduction { sum, sum_of_squares, count_zeros };

// `stored_factor`: count_zeros' (checked by it), empty for the others.
void reduce(Device& device, View total, View values, Reduction reduction, const char* op,
            View stored_factor = {}) {
  const bool stored = !stored_factor.empty();
  run(
      device, op, 0,
      [=] {
        double* result = host<double>(total);
        if (result == nullptr || total.numel != 1) {
          common::fail("{}: the total must be one f64", op);
        }
        host_scalar(values.type, op, [&](auto s) {
          using S = decltype(s);
          const S* data = host<S>(values);
          switch (reduction) {
            case Reduction::sum: cpu::sum(result, data, values.numel); return;
            case Reduction::sum_of_squares: cpu::sum_of_squares(result, data, values.numel); return;
            case Reduction::count_zeros:
              cpu::count_zeros(result, data, values.numel,
                               stored ? *host<double>(stored_factor) : 1.0);
              return;
          }
        });
      },
      [&](const auto& context) {
        double* result = gpu<double>(total, op);
        if (result == nullptr || total.numel != 1) {
          common::fail("{}: the total must be one f64", op);
        }
        check_on_gpu(values, op);
        // The first pass's block sums, in the device's scratch.
        auto* partials = static_cast<double*>(
            device.scratch(cuda::kReductionPartials * int64_t{sizeof(double)}, op));
        auto reduce_on_gpu = [&](const auto* data) {
          switch (reduction) {
            case Reduction::sum:
              cuda::sum(result, partials, data, values.numel, context.stream);
              return;
            case Reduction::sum_of_squares:
              cuda::sum_of_squares(result, partials, data, values.numel, context.stream);
              return;
            case Reduction::count_zeros:
              cuda::count_zeros(result, partials, data, values.numel, 1.0,
                                stored ? gpu<double>(stored_factor, op) : nullptr, context.stream);
              return;
          }
        };
        switch (values.type) {
          case ElementType::f32:
            reduce_on_gpu(static_cast<const float*>(values.data));
            return;
          case ElementType::bf16:
            reduce_on_gpu(static_cast<const bfloat16*>(values.data));
            return;
          case ElementType::f16:
            reduce_on_gpu(static_cast<const float16*>(values.data));
            return;
          case ElementType::f64:
            reduce_on_gpu(static_cast<const double*>(values.data));
            return;
          default:
            common::fail("the CUDA device reduces fp32, bf16, fp16 or fp64; {} has no {} kernel "
                         "on it",
                         op, element_name(values.type));
        }
      });
}

}  // namespace

void sum(Device& device, View total, View values) {
  reduce(device, total, values, Reduction::sum, "sum");
}

void sum_of_squares(Device& device, View total, View values) {
  reduce(device, total, values, Reduction::sum_of_squares, "sum_of_squares");
}

void count_zeros(Device& device, View total, View values, View stored_factor) {
  constexpr const char* op = "count_zeros";
  if (!stored_factor.empty()) check_scalars(stored_factor, 1, "the stored factor", op);
  reduce(device, total, values, Reduction::count_zeros, op, stored_factor);
}

void scale(Device& device, View values, double factor, View stored_factor) {
  constexpr const char* op = "scale";
  const bool stored = !stored_factor.empty();
  if (stored) check_scalars(stored_factor, 1, "the stored factor", op);
  run_typed(
      device, op, 0, values.type,
      [=](auto s) {
        using S = decltype(s);
        cpu::scale(host<S>(values), stored ? *host<double>(stored_factor) : factor, values.numel);
      },
      [&](auto s, const auto& context) {
        using S = decltype(s);
        cuda::scale(gpu<S>(values, op), factor, stored ? gpu<double>(stored_factor, op) : nullptr,
                    values.numel, context.stream);
      });
}

}  // namespace backend::ops
