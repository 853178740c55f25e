// The AdamW update over the parameter groups of flat buffers (Loshchilov & Hutter, 2019), as
// torch.optim.AdamW and Megatron's fused Adam in adam_w_mode compute it, per element i:
//   m = β1 m + (1 − β1) g;   v = β2 v + (1 − β2) g²
//   master -= step_size · m / (sqrt(v) · inverse_sqrt_correction2 + ε) + decay · master
// with step_size = lr / (1 − β1^t), inverse_sqrt_correction2 = 1 / sqrt(1 − β2^t) and
// decay = lr · weight_decay (0 where the range is not decayed): optim/adamw.hpp computes these
// once per step, in double, and rounds them to float once.
// The coefficients are read from the device's memory (`coefficients`, an AdamWCoefficients
// uploaded there), not passed as arguments: they change every step with the learning rate and
// the bias corrections, and a captured step (a CUDA graph) replays its kernels' arguments as
// they were captured; what the kernel reads from memory it reads anew at each replay.
// Clipping (optim/adamw.hpp) is folded in: g is the gradient times coefficients.gradient_scale,
// the bits a separate scale pass over the gradients gives, without that pass.
// `control`, when given (ops/step_scalars.hpp's decide_step, on the device): the gradient scale
// is control[0] in place of coefficients.gradient_scale, and control[1] ≠ 0 skips the update
// (nothing is written), so the host need not know the decision before it queues the step.
// Mixed precision (Megatron's Float16OptimizerWithFloat16Params): master, gradients and the
// moments are fp32 under every precision; `weights`, when given, is the bf16 working copy the
// forward reads, written in the same pass as round_to_nearest_even(master). With fp32 weights
// the master is the weights and `weights` is absent (nullptr).
// Contract: updates master, exp_avg, exp_avg_sq in place (and writes weights); gradients are
// read only. Elementwise: the result depends on the element alone, never on the thread count.
// Multi-tensor, as Megatron's fused Adam (apex's multi_tensor_apply) is: one call updates every
// group of the buffers, each decayed or not (`groups`: sorted, disjoint ranges; empty: one
// decayed group of all N elements); elements in no group are left as they are. On a GPU the
// groups go to the kernel as its argument, up to kAdamWGroupsPerLaunch per launch (one launch
// for GPT-2 124M's 100 or so runs of decayed and undecayed tensors), each block updating one
// chunk of kAdamWChunk elements of one group.
// Dimensions: N elements of the flat buffers (optim/adamw.hpp calls it once per step).
#pragma once

#include <cstdint>
#include <span>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend {

// One step's coefficients, rounded to float once (the CPU and CUDA twins read the same bits).
// Laid out as kAdamWCoefficientFloats floats: the op's `coefficients` view is this struct in
// the device's memory.
struct AdamWCoefficients {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float step_size = 0;                 // lr / (1 − β1^t)
  float inverse_sqrt_correction2 = 1;  // 1 / sqrt(1 − β2^t)
  float decay = 0;                     // lr · weight_decay, or 0 for an undecayed group
  // The gradients' factor, applied as they are read: g = gradient · gradient_scale (rounded to
  // float, the product a separate ops::scale pass would have stored). Clipping's coefficient
  // folded into the update, so the step reads the gradients once; 1 leaves them as they are.
  float gradient_scale = 1;
};

// One range of the buffers the update covers, and whether weight decay applies to it.
struct AdamWGroup {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decayed = true;
};

inline constexpr int64_t kAdamWCoefficientFloats = 7;
static_assert(sizeof(AdamWCoefficients) == kAdamWCoefficientFloats * sizeof(float),
              "AdamWCoefficients is its floats, so a view of f32 holds it");

// A host view of `coefficients` (the CPU device's form of the op's argument, and the bytes an
// upload to another device reads).
inline View coefficients_view(AdamWCoefficients& coefficients) {
  return View{&coefficients, kAdamWCoefficientFloats, ElementType::f32, MemoryKind::host};
}

inline constexpr int64_t kAdamWChunk = int64_t{1} << 16;  // elements per GPU block
inline constexpr int kAdamWGroupsPerLaunch = 128;         // kernel argument under 4 KiB

}  // namespace backend

namespace backend::cpu {

void adamw_update(float* master,           // (N) fp32 master weights, updated
                  const float* gradients,  // (N)
                  float* exp_avg,          // (N) first moment, updated
                  float* exp_avg_sq,       // (N) second moment, updated
                  int64_t count,
                  const AdamWCoefficients* coefficients,  // (1), read when the update runs
                  const double* control,                  // (2) or nullptr
                  std::span<const AdamWGroup> groups);

}  // namespace backend::cpu

// The CUDA twin (adamw_cuda.cu), Weight float (weights nullptr: the master is the weights) or
// bfloat16 or float16 (the working copy, written rounded in the same pass).
namespace backend::cuda {

template <typename Weight>
void adamw_update(float* master, Weight* weights, const float* gradients, float* exp_avg,
                  float* exp_avg_sq, int64_t count, const AdamWCoefficients* coefficients,
                  const double* control, std::span<const AdamWGroup> groups, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory: master, gradients and moments fp32; weights absent (fp32: the
// master is the weights) or, on a GPU, the bf16 or fp16 working copy, written in the same pass;
// coefficients kAdamWCoefficientFloats f32 holding an AdamWCoefficients; control empty or two
// f64.
namespace backend::ops {

void adamw_update(Device& device, View master, View weights, View gradients, View exp_avg,
                  View exp_avg_sq, View coefficients, View control = {},
                  std::span<const AdamWGroup> groups = {});

}  // namespace backend::ops
