// AdamW with decoupled weight decay (Loshchilov & Hutter, 2019), as torch.optim.AdamW and
// Megatron's fused Adam in adam_w_mode compute it, over one flat parameter buffer:
//   m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   p -= lr · ( (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + ε) + wd · p )   [wd only where decayed]
// plus Megatron's global-norm gradient clipping (megatron/core/optimizer/clip_grads.py):
//   norm = sqrt(Σ g²);  if max_norm > 0 and norm > max_norm: g *= max_norm / (norm + 1e-6)
// A non-finite norm skips the step (the caller counts it as a nan iteration), so NaN never
// reaches the weights.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/common/lazy_zero_allocator.hpp"

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
  AdamW(const AdamWConfig& config, std::vector<ParameterGroup> groups, int64_t numel);
  // One update with learning rate `lr`. `gradients` is not modified.
  void step(std::span<float> parameters, std::span<const float> gradients, double lr);
  // The same with this step's weight decay instead of the config's (Megatron's scheduler sets
  // the decay of each step: --start-weight-decay → --end-weight-decay).
  void step(std::span<float> parameters, std::span<const float> gradients, double lr,
            double weight_decay);
  int64_t steps_taken() const { return step_; }
  const AdamWConfig& config() const { return config_; }

  // The state a checkpoint saves and restores (torch's state['exp_avg'], ['exp_avg_sq'] and
  // ['step']): the moment estimates, one value per parameter of the flat buffer, and the
  // number of steps taken, which the bias corrections depend on.
  std::span<float> exp_avg() { return exp_avg_; }
  std::span<const float> exp_avg() const { return exp_avg_; }
  std::span<float> exp_avg_sq() { return exp_avg_sq_; }
  std::span<const float> exp_avg_sq() const { return exp_avg_sq_; }
  void set_steps_taken(int64_t steps);

 private:
  AdamWConfig config_;
  std::vector<ParameterGroup> groups_;
  // Zeros without a fill pass: the first step() faults the pages in (lazy_zero_allocator.hpp).
  std::vector<float, common::LazyZeroAllocator<float>> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

// L2 norm of all gradients, accumulated in double so it does not depend on the thread count.
double global_gradient_norm(std::span<const float> gradients);

// Scales gradients by max_norm / (norm + 1e-6) when norm > max_norm (max_norm ≤ 0: no clipping).
void clip_gradients(std::span<float> gradients, double norm, double max_norm);

}  // namespace backend
