// CUDA twin of step_scalars.hpp (CPU twin: step_scalars_cpu.cpp): each op one thread of one
// block, the CPU twin's double expressions (IEEE division and sqrt, no contraction to change a
// bit: nothing here is a multiply followed by an add of its product except the weighted mean,
// whose product is exact when it is an integer count times a float).
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/step_scalars.hpp"

namespace backend::cuda {
namespace {

__global__ void accumulate_loss_kernel(double* total, const double* micro_batch_total,
                                       int64_t scored_positions,
                                       const double* stored_scored_positions, bool weighted,
                                       bool mean_in_float) {
  const double positions = stored_scored_positions != nullptr
                               ? *stored_scored_positions
                               : static_cast<double>(scored_positions);
  if (positions == 0) return;
  double mean = __ddiv_rn(*micro_batch_total, positions);
  if (mean_in_float) mean = static_cast<double>(__double2float_rn(mean));
  *total = __dadd_rn(*total, weighted ? __dmul_rn(mean, positions) : mean);
}

__global__ void add_kernel(double* total, const double* value) {
  *total = __dadd_rn(*total, *value);
}

__global__ void decide_step_kernel(double* control, const double* loss_total,
                                   const double* sum_of_squares, double max_norm) {
  const double norm = sqrt(*sum_of_squares);
  const bool skip = !isfinite(norm) || (loss_total != nullptr && !isfinite(*loss_total));
  double gradient_scale = 1.0;
  if (max_norm > 0) {
    const double coefficient = __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
    if (coefficient < 1.0) gradient_scale = static_cast<double>(__double2float_rn(coefficient));
  }
  control[0] = gradient_scale;
  control[1] = skip ? 1.0 : 0.0;
}

}  // namespace

void accumulate_loss(double* total, const double* micro_batch_total, int64_t scored_positions,
                     const double* stored_scored_positions, bool weighted, bool mean_in_float,
                     CudaStream stream) {
  accumulate_loss_kernel<<<1, 1, 0, stream>>>(total, micro_batch_total, scored_positions,
                                              stored_scored_positions, weighted, mean_in_float);
  CUDA_CHECK(cudaGetLastError());
}

void add(double* total, const double* value, CudaStream stream) {
  add_kernel<<<1, 1, 0, stream>>>(total, value);
  CUDA_CHECK(cudaGetLastError());
}

void decide_step(double* control, const double* loss_total, const double* sum_of_squares,
                 double max_norm, CudaStream stream) {
  decide_step_kernel<<<1, 1, 0, stream>>>(control, loss_total, sum_of_squares, max_norm);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace backend::cuda
