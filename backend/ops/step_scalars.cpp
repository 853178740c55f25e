// step_scalars.hpp's ops over Views: the views checked once, then the CPU or the CUDA twin
// (ops/dispatch.hpp).
#include "backend/ops/step_scalars.hpp"

#include "backend/ops/dispatch.hpp"

namespace backend::ops {

using namespace detail;

void accumulate_loss(Device& device, View total, View micro_batch_total, int64_t scored_positions,
                     bool weighted, bool mean_in_float, View stored_scored_positions) {
  constexpr const char* op = "accumulate_loss";
  check_scalars(total, 1, "the total", op);
  check_scalars(micro_batch_total, 1, "the micro batch's total", op);
  const bool stored = !stored_scored_positions.empty();
  if (stored) check_scalars(stored_scored_positions, 1, "the stored count", op);
  if (scored_positions < 0) {
    common::fail("{}: {} scored positions; a count is ≥ 0", op, scored_positions);
  }
  run(
      device, op, 0,
      [=] {
        const int64_t count = stored ? static_cast<int64_t>(*host<double>(stored_scored_positions))
                                     : scored_positions;
        cpu::accumulate_loss(host<double>(total), host<double>(micro_batch_total), count, weighted,
                             mean_in_float);
      },
      [&](const auto& context) {
        cuda::accumulate_loss(gpu<double>(total, op), gpu<double>(micro_batch_total, op),
                              scored_positions,
                              stored ? gpu<double>(stored_scored_positions, op) : nullptr, weighted,
                              mean_in_float, context.stream);
      });
}

void add(Device& device, View total, View value) {
  constexpr const char* op = "add";
  check_scalars(total, 1, "the total", op);
  check_scalars(value, 1, "the value", op);
  run(
      device, op, 0, [=] { cpu::add(host<double>(total), host<double>(value)); },
      [&](const auto& context) {
        cuda::add(gpu<double>(total, op), gpu<double>(value, op), context.stream);
      });
}

void decide_step(Device& device, View control, View loss_total, View sum_of_squares,
                 double max_norm) {
  constexpr const char* op = "decide_step";
  check_scalars(control, 2, "the control", op);
  if (!loss_total.empty()) check_scalars(loss_total, 1, "the loss total", op);
  check_scalars(sum_of_squares, 1, "the sum of squares", op);
  run(
      device, op, 0,
      [=] {
        cpu::decide_step(host<double>(control),
                         loss_total.empty() ? nullptr : host<double>(loss_total),
                         host<double>(sum_of_squares), max_norm);
      },
      [&](const auto& context) {
        cuda::decide_step(gpu<double>(control, op), gpu<double>(loss_total, op),
                          gpu<double>(sum_of_squares, op), max_norm, context.stream);
      });
}

}  // namespace backend::ops
