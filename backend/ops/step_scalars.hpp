// A training step's scalars, computed where the step runs so that the host waits for none of
// them until it reads them once, after the whole step is queued (issue 39, item 4; the rules are
// train_step.hpp's, which the host used to apply to values it read back mid-step):
//   accumulate_loss: total += mean · weight with mean = micro_batch_total / scored_positions
//     rounded to the model's Scalar (`mean_in_float`: float, else double) and weight the scored
//     positions (--calculate-per-token-loss) or 1; a micro batch without a scored position adds
//     nothing (its loss is 0, Megatron's 0/0). The sum the host formed from forward()'s
//     returned losses, the same bits. The count is an argument, or read from device memory
//     when the op runs (a captured step's micro batches each have theirs, a whole number
//     held as an f64).
//   add: total += value (a norm's ranges added in order, as the host added them).
//   decide_step: Megatron's clipping coefficient and the skip decision from the step's loss
//     total and the gradients' sum of squares (megatron/core/optimizer/clip_grads.py,
//     MixedPrecisionOptimizer.step):
//       norm = sqrt(sum_of_squares)
//       skip = norm not finite, or (a loss total given: no loss scaler) the loss not finite
//       gradient_scale = max_norm / (norm + 1e-6) when max_norm > 0 and that is below 1, else 1,
//                        rounded to float (the factor ops::scale would have applied)
//     written as control = {gradient_scale, skip ? 1 : 0}, which ops::adamw_update reads.
// Every value is one f64 element of the device's memory; the arithmetic is double, IEEE
// division and square root, one thread: the twins give the same bits.
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

void accumulate_loss(double* total, const double* micro_batch_total, int64_t scored_positions,
                     bool weighted, bool mean_in_float);
void add(double* total, const double* value);
// loss_total nullptr: the loss does not decide (a loss scaler's found_inf is the norm's).
void decide_step(double* control, const double* loss_total, const double* sum_of_squares,
                 double max_norm);

}  // namespace backend::cpu

// The CUDA twins (step_scalars_cuda.cu): one thread on the device's stream.
namespace backend::cuda {

void accumulate_loss(double* total, const double* micro_batch_total, int64_t scored_positions,
                     const double* stored_scored_positions,  // replaces the count when not null
                     bool weighted, bool mean_in_float, CudaStream stream);
void add(double* total, const double* value, CudaStream stream);
void decide_step(double* control, const double* loss_total, const double* sum_of_squares,
                 double max_norm, CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory: `total`, `micro_batch_total`, `value`, `loss_total` and
// `sum_of_squares` one f64 each, `control` two (else common::Error naming the op); an empty
// loss_total: the loss does not decide.
namespace backend::ops {

// `stored_scored_positions`, one f64 of the device's memory, replaces scored_positions when
// given.
void accumulate_loss(Device& device, View total, View micro_batch_total, int64_t scored_positions,
                     bool weighted, bool mean_in_float, View stored_scored_positions = {});
void add(Device& device, View total, View value);
void decide_step(Device& device, View control, View loss_total, View sum_of_squares,
                 double max_norm);

}  // namespace backend::ops
