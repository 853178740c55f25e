// CUDA twin of adamw.hpp (CPU twin: adamw_cpu.cpp): the same float expressions in the same
// order as the CPU twin (nvcc may contract a multiply-add into an fma where the CPU build does
// not, so the bits can differ in the last place; the tests compare by normalised error). With a
// bf16 working copy the rounded master is written in the same pass, so the forward never reads
// a stale copy and no second kernel reads the master again (llm.c's adamw_kernel3 does the
// same). Multi-tensor as apex's multi_tensor_apply: the groups travel in the kernel's argument,
// kAdamWGroupsPerLaunch at a time, and block b updates chunk b of the launch's chunks (each
// group cut into kAdamWChunk-element chunks, numbered group after group), found by a binary
// search over the groups' first chunks.
#include <algorithm>

#include "backend/ops/adamw.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

struct LaunchGroups {
  int64_t offset[kAdamWGroupsPerLaunch];
  int64_t numel[kAdamWGroupsPerLaunch];
  int64_t first_chunk[kAdamWGroupsPerLaunch];
  bool decayed[kAdamWGroupsPerLaunch];
  int count;
};
static_assert(sizeof(LaunchGroups) + 7 * sizeof(void*) < 4000,
              "a kernel's arguments stay under 4 KiB");

template <typename Weight>
__global__ void adamw_kernel(float* master, Weight* weights, const float* gradients, float* exp_avg,
                             float* exp_avg_sq, const AdamWCoefficients* coefficients,
                             const double* control, const LaunchGroups groups) {
  // The decision of ops::decide_step, when given, and the step's coefficients: every thread
  // reads the same bytes (one cached line).
  if (control != nullptr && control[1] != 0.0) return;
  const AdamWCoefficients c = *coefficients;
  const float gradient_scale =
      control != nullptr ? static_cast<float>(control[0]) : c.gradient_scale;
  const int64_t chunk = blockIdx.x;
  int low = 0, high = groups.count - 1;  // the last group whose first chunk is ≤ chunk
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (groups.first_chunk[middle] <= chunk) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  const int64_t group_end = groups.offset[low] + groups.numel[low];
  const int64_t begin = groups.offset[low] + (chunk - groups.first_chunk[low]) * kAdamWChunk;
  const int64_t end = begin + kAdamWChunk < group_end ? begin + kAdamWChunk : group_end;
  const float decay = groups.decayed[low] ? c.decay : 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = gradients[i] * gradient_scale;
    const float m = c.beta1 * exp_avg[i] + (1.0f - c.beta1) * g;
    const float v = c.beta2 * exp_avg_sq[i] + (1.0f - c.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denominator = sqrtf(v) * c.inverse_sqrt_correction2 + c.eps;
    const float p = master[i];
    const float updated = p - (c.step_size * m / denominator + decay * p);
    master[i] = updated;
    if (weights != nullptr) weights[i] = detail::from_float<Weight>(updated);
  }
}

}  // namespace

template <typename Weight>
void adamw_update(float* master, Weight* weights, const float* gradients, float* exp_avg,
                  float* exp_avg_sq, int64_t count, const AdamWCoefficients* coefficients,
                  const double* control, std::span<const AdamWGroup> groups, CudaStream stream) {
  const AdamWGroup whole{.offset = 0, .numel = count, .decayed = true};
  if (groups.empty()) groups = std::span(&whole, 1);
  LaunchGroups launch{};
  int64_t chunks = 0;
  const auto flush = [&] {
    if (chunks > 0) {
      adamw_kernel<<<static_cast<unsigned>(chunks), detail::kBlockSize, 0, stream>>>(
          master, detail::device_pointer(weights), gradients, exp_avg, exp_avg_sq, coefficients,
          control, launch);
      CUDA_CHECK(cudaGetLastError());
    }
    launch.count = 0;
    chunks = 0;
  };
  for (const AdamWGroup& group : groups) {
    if (group.numel <= 0) continue;
    if (launch.count == kAdamWGroupsPerLaunch) flush();
    const int slot = launch.count++;
    launch.offset[slot] = group.offset;
    launch.numel[slot] = group.numel;
    launch.first_chunk[slot] = chunks;
    launch.decayed[slot] = group.decayed;
    chunks += (group.numel + kAdamWChunk - 1) / kAdamWChunk;
  }
  flush();
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, int64_t,
                                  const AdamWCoefficients*, const double*,
                                  std::span<const AdamWGroup>, CudaStream);
template void adamw_update<bfloat16>(float*, bfloat16*, const float*, float*, float*, int64_t,
                                     const AdamWCoefficients*, const double*,
                                     std::span<const AdamWGroup>, CudaStream);
template void adamw_update<float16>(float*, float16*, const float*, float*, float*, int64_t,
                                    const AdamWCoefficients*, const double*,
                                    std::span<const AdamWGroup>, CudaStream);

}  // namespace backend::cuda
