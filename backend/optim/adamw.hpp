// AdamW with decoupled weight decay (Loshchilov & Hutter, 2019), as torch.optim.AdamW and
// Megatron's fused Adam in adam_w_mode compute it, over one flat parameter buffer:
//   m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   p -= lr · ( (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + ε) + wd · p )   [wd only where decayed]
// plus Megatron's global-norm gradient clipping (megatron/core/optimizer/clip_grads.py):
//   norm = sqrt(Σ g²);  if max_norm > 0 and norm > max_norm: g *= max_norm / (norm + 1e-6)
// A non-finite norm skips the step (the caller counts it as a nan iteration), so NaN never
// reaches the weights.
//
// The optimizer runs where the model runs: its moments live on a Device (one arena, carved at
// construction), and the update, the norm's sum of squares and the clipping are that device's
// ops (ops/adamw.hpp, ops/reduction.hpp); the host reads the one double of the norm, or a
// training step keeps even that on the device and reads it once the step is queued
// (StepScalars, the step's decision given to step() as its control). The
// moments and the master weights are fp32 under every precision (Megatron's mixed-precision
// optimizer), so checkpoints do not depend on the device or the precision.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/device/arena.hpp"
#include "backend/device/device.hpp"
#include "backend/device/pinned_upload_ring.hpp"
#include "backend/ops/adamw.hpp"
#include "backend/optim/loss_scaler.hpp"

namespace backend {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// One contiguous range of the flat buffer and whether weight decay applies to it.
struct ParameterGroup {
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = true;
};

class AdamW {
 public:
  // The moments on `device`, which must outlive the optimizer; `numel` parameters, the groups
  // ranges of them. The second form keeps them on a CpuDevice of its own (host memory).
  AdamW(const AdamWConfig& config, std::vector<ParameterGroup> groups, int64_t numel,
        Device& device);
  AdamW(const AdamWConfig& config, std::vector<ParameterGroup> groups, int64_t numel);
  ~AdamW();
  AdamW(AdamW&&) noexcept;
  AdamW& operator=(AdamW&&) noexcept;

  // One update with learning rate `lr` and this step's weight decay (Megatron's scheduler sets
  // it: --start-weight-decay → --end-weight-decay) of the fp32 `master` weights from the fp32
  // `gradients` (not modified), views of `numel` elements on the device. `weights`: absent
  // when the master is the weights (fp32), or the bf16 working copy, rewritten from the master
  // in the same pass. `gradient_scale`: a factor the gradients are read with (clipping's
  // coefficient, clip_coefficient; the bits of clip_gradients before the step, without its
  // pass over them).
  // `control`: the step's decision on the device (StepScalars::control, ops::decide_step), which
  // then gives the gradient scale (gradient_scale must be 1) and may skip the update there; the
  // step counts as taken until the caller, having read the decision, calls step_skipped().
  void step(View master, View weights, View gradients, double lr, double weight_decay,
            double gradient_scale = 1.0, View control = {});
  // step() in its two parts, for a captured step (docs/step_on_device.md, item 5): stage_step
  // counts the next step and uploads its coefficients (from the rate, the decay, the bias
  // corrections of the step count and the gradient scale) to the optimizer's device, where the
  // update reads them; queue_step queues the update of the staged step. A captured update (a
  // graph) is queue_step's work replayed: the trainer stages each step before the replay.
  void stage_step(double lr, double weight_decay, double gradient_scale = 1.0);
  void queue_step(View master, View weights, View gradients, View control = {});
  // The last step() with a control was skipped on the device: not counted (the bias
  // corrections of the next step are those of the skipped one).
  void step_skipped();
  // The same over host memory (the optimizer's device is the CPU), with the config's decay or
  // this step's.
  void step(std::span<float> parameters, std::span<const float> gradients, double lr);
  void step(std::span<float> parameters, std::span<const float> gradients, double lr,
            double weight_decay);
  int64_t steps_taken() const { return step_; }
  int64_t numel() const { return numel_; }
  const AdamWConfig& config() const { return config_; }
  Device& device() const { return *device_; }

  // The L2 norm of `gradients` (fp32, on the device), summed there in a fixed order
  // (ops/reduction.hpp); the host waits for this one double. The sum of squares alone (of any
  // fp32 view: gradients, or the parameters for --log-params-norm) is what a sharded optimizer
  // adds up over its ranks before the square root.
  double gradient_norm(View gradients);
  double sum_of_squares(View values);
  // Megatron's clipping of `gradients` on the device, given their norm (max_norm ≤ 0: none).
  void clip_gradients(View gradients, double norm, double max_norm);

  // A training step's scalars on the optimizer's device (ops/step_scalars.hpp; train_step.cpp),
  // one f64 each and adjacent, so the host reads them in one copy (`all`) once the step is
  // queued: the loss total the forwards add to, the gradients' sum of squares, a total that is
  // only logged (--log-params-norm's), a partial sum (scratch for sums over ranges), the
  // decision (two: the gradient scale and the skip), and --log-num-zeros-in-grad's count.
  // `host`: seven doubles of page-locked host memory (Device::allocate_pinned_host) that a
  // queued copy of `all` lands in, so the host reads a step's scalars while the device goes on.
  struct StepScalars {
    View loss_total, sum_of_squares, logged_total, partial, control, zeros_in_grad;
    View all;  // the seven, in that order
    double* host = nullptr;
  };
  StepScalars step_scalars() const { return step_scalars_; }

  // The state a checkpoint saves and restores (torch's state['exp_avg'], ['exp_avg_sq'] and
  // ['step']): the moment estimates, one value per parameter of the flat buffer, and the
  // number of steps taken, which the bias corrections depend on. The spans are the moments in
  // place, for an optimizer on host memory only (common::Error on a GPU); the copies work on
  // every device.
  std::span<float> exp_avg();
  std::span<const float> exp_avg() const;
  std::span<float> exp_avg_sq();
  std::span<const float> exp_avg_sq() const;
  void copy_moments_to_host(std::span<float> exp_avg, std::span<float> exp_avg_sq) const;
  void copy_moments_from_host(std::span<const float> exp_avg, std::span<const float> exp_avg_sq);
  void set_steps_taken(int64_t steps);

  // The gradient scaler of Megatron's mixed-precision optimizer (loss_scaler.hpp), held here as
  // Megatron's optimizer holds it, so a checkpoint of the optimizer carries its state. none()
  // unless the trainer sets one (--fp16, or --loss-scale with --bf16).
  LossScaler& loss_scaler() { return loss_scaler_; }
  const LossScaler& loss_scaler() const { return loss_scaler_; }
  void set_loss_scaler(const LossScaler& scaler) { loss_scaler_ = scaler; }

 private:
  void carve_state();
  void check_step(View master, View gradients, View control, double gradient_scale) const;

  AdamWConfig config_;
  // Adjacent groups with the same decay merged, as the update takes them (one call per step).
  std::vector<AdamWGroup> groups_;
  int64_t numel_ = 0;
  std::unique_ptr<Device> owned_device_;  // the CpuDevice of the host-memory form
  Device* device_ = nullptr;
  // Zeros without a fill pass on the CPU: the first step faults the pages in.
  Arena state_;
  DeviceMemory step_scalars_host_;
  View exp_avg_, exp_avg_sq_, norm_total_;
  View coefficients_;  // the staged step's AdamWCoefficients, which the update reads
  PinnedUploadRing coefficient_uploads_;
  bool staged_ = false;
  double staged_gradient_scale_ = 1.0;
  StepScalars step_scalars_;
  int64_t step_ = 0;
  LossScaler loss_scaler_ = LossScaler::none();
};

// The same norm and clipping over host memory, with the CPU twins (the tests' form).
// L2 norm of all gradients, accumulated in double so it does not depend on the thread count.
double global_gradient_norm(std::span<const float> gradients);

// Scales gradients by max_norm / (norm + 1e-6) when norm > max_norm (max_norm ≤ 0: no clipping).
void clip_gradients(std::span<float> gradients, double norm, double max_norm);

// The factor clipping multiplies by, or nullopt when it leaves the gradients alone.
std::optional<double> clip_coefficient(double norm, double max_norm);

}  // namespace backend
