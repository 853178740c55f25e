// Whole-buffer reductions and scaling, in a fixed order so the same inputs give the same bits
// run after run (no float atomics, nothing that depends on the thread count):
//   sum:            total = Σ values[i]      (the micro batch's loss from the per-token losses)
//   sum_of_squares: total = Σ values[i]²     (the global gradient norm is sqrt of it, as
//                                             Megatron's clip_grad_norm_fp32 computes it)
//   count_zeros:    total = #{i : values[i] · factor = 0}  (--log-num-zeros-in-grad, Megatron's
//                                             count_zeros_fp32 of the clipped gradients: the
//                                             product AdamW's pass forms with the clipping
//                                             factor, in the element type, so a gradient the
//                                             factor underflows counts; −0 counts, NaN does
//                                             not; exact in double below 2^53 elements, in any
//                                             order)
//   scale:          values[i] *= factor      (gradient clipping by max_norm / (norm + 1e-6),
//                                             and fp16 loss-scale unscaling by 1 / scale)
// Totals are one double; the products and sums are formed in double. The factor is rounded
// once to the element type, as the twins take their scalars; it may be read from the device's
// memory when the op runs instead (one f64: a captured step's factor, which changes from step
// to step, docs/step_on_device.md).
// The order: CPU sums `sum` left to right; `sum_of_squares` in chunks of 2^16 elements, element
// i of a chunk into lane i mod 16, lanes added in order, chunks added in order (vectorises,
// and depends on the size alone). CUDA: kReductionPartials blocks of threads, each thread
// striding over the buffer, a fixed tree per block, the partials in a fixed tree. The two
// orders differ, so the twins agree to rounding, each with itself bit for bit.
// Dimensions: N elements (any shape, flattened).
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend::cpu {

template <typename Scalar>
void sum(double* total, const Scalar* values, int64_t count);
template <typename Scalar>
void sum_of_squares(double* total, const Scalar* values, int64_t count);
template <typename Scalar>
void count_zeros(double* total, const Scalar* values, int64_t count, double factor = 1.0);
template <typename Scalar>
void scale(Scalar* values, double factor, int64_t count);

}  // namespace backend::cpu

// The CUDA twins (reduction_cuda.cu), Scalar float, bfloat16 or float16 (and double for the
// sums). `partials` is device memory of kReductionPartials doubles, the first pass's block sums;
// total is device memory.
namespace backend::cuda {

inline constexpr int64_t kReductionPartials = 256;

template <typename Scalar>
void sum(double* total, double* partials, const Scalar* values, int64_t count, CudaStream stream);
template <typename Scalar>
void sum_of_squares(double* total, double* partials, const Scalar* values, int64_t count,
                    CudaStream stream);
template <typename Scalar>
void count_zeros(double* total, double* partials, const Scalar* values, int64_t count,
                 double factor,
                 const double* stored_factor,  // replaces factor when not null
                 CudaStream stream);
template <typename Scalar>
void scale(Scalar* values, double factor,
           const double* stored_factor,  // replaces factor when not null
           int64_t count, CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory: total is one f64 element of it (else common::Error naming the
// op); values fp32 or fp64 on the CPU, fp32, bf16, fp16 or fp64 on a GPU (scale: not fp64
// there).
namespace backend::ops {

void sum(Device& device, View total, View values);
void sum_of_squares(Device& device, View total, View values);
// `stored_factor`: one f64 of the device's memory (the step's clipping factor, StepScalars'
// control[0]), read when the op runs; empty: 1.
void count_zeros(Device& device, View total, View values, View stored_factor = {});
void scale(Device& device, View values, double factor, View stored_factor = {});

}  // namespace backend::ops
