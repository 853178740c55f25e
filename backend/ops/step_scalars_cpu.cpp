// CPU twin of step_scalars.hpp.
#include <cmath>

#include "backend/ops/step_scalars.hpp"

namespace backend::cpu {

void accumulate_loss(double* total, const double* micro_batch_total, int64_t scored_positions,
                     bool weighted, bool mean_in_float) {
  if (scored_positions == 0) return;
  const double positions = static_cast<double>(scored_positions);
  double mean = *micro_batch_total / positions;
  if (mean_in_float) mean = static_cast<double>(static_cast<float>(mean));
  *total += weighted ? mean * positions : mean;
}

void add(double* total, const double* value) {
  *total += *value;
}

void decide_step(double* control, const double* loss_total, const double* sum_of_squares,
                 double max_norm) {
  const double norm = std::sqrt(*sum_of_squares);
  const bool skip = !std::isfinite(norm) || (loss_total != nullptr && !std::isfinite(*loss_total));
  double gradient_scale = 1.0;
  if (max_norm > 0) {
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0) gradient_scale = static_cast<double>(static_cast<float>(coefficient));
  }
  control[0] = gradient_scale;
  control[1] = skip ? 1.0 : 0.0;
}

}  // namespace backend::cpu
