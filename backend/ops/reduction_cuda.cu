// CUDA twin of reduction.hpp (CPU twin: reduction_cpu.cpp), and fp64 for the sums. Two passes, no atomics: block b of
// kReductionPartials sums elements b·kThreads + t + k·(kReductionPartials·kThreads), each
// thread in increasing k, then the block's threads in a fixed tree, into partials[b]; one block
// then adds the partials in the same fixed tree. The order depends on the size alone, so the
// total is the same bits on every run and every GPU. Sums are in double (a 1B-parameter
// gradient norm in float would lose the small gradients' contribution).
#include <type_traits>

#include "backend/ops/cuda_common.cuh"
#include "backend/ops/reduction.hpp"

namespace backend::cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the tree below halves it
constexpr int kPartials = static_cast<int>(kReductionPartials);
static_assert((kPartials & (kPartials - 1)) == 0, "the final tree halves the partials");

__device__ inline double as_double(float value) { return static_cast<double>(value); }
__device__ inline double as_double(double value) { return value; }
__device__ inline double as_double(__nv_bfloat16 value) {
  return static_cast<double>(__bfloat162float(value));
}
__device__ inline double as_double(__half value) {
  return static_cast<double>(__half2float(value));
}

// What each element adds: itself, its square, or 1 when it is zero (count_zeros: integers in
// double, exact in any order).
enum class Measure { value, square, zero };

// Whether `value` times the clipping factor is zero, in the precision AdamW's pass forms that
// product (float; double for double values), the factor rounded once as the CPU twin rounds it.
template <typename T>
__device__ inline bool zero_when_scaled(double value, double factor) {
  if constexpr (std::is_same_v<T, double>) {
    return value * factor == 0.0;
  } else {
    return static_cast<float>(value) * static_cast<float>(factor) == 0.0F;
  }
}

// `factor`, `stored_factor`: count_zeros' scale of each element (stored_factor replaces factor
// when not null); the other measures ignore them.
template <Measure kMeasure, typename T>
__global__ void partials_kernel(double* partials, const T* values, int64_t count, double factor,
                                const double* stored_factor) {
  __shared__ double lane[kThreads];
  const int64_t stride = int64_t{kPartials} * kThreads;
  if constexpr (kMeasure == Measure::zero) {
    if (stored_factor != nullptr) factor = *stored_factor;
  }
  double accumulated = 0;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < count; i += stride) {
    const double value = as_double(values[i]);
    if constexpr (kMeasure == Measure::square) {
      accumulated += value * value;
    } else if constexpr (kMeasure == Measure::zero) {
      accumulated += zero_when_scaled<T>(value, factor) ? 1.0 : 0.0;
    } else {
      accumulated += value;
    }
  }
  lane[threadIdx.x] = accumulated;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = lane[0];
}

__global__ void final_kernel(double* total, const double* partials) {
  __shared__ double lane[kPartials];
  lane[threadIdx.x] = partials[threadIdx.x];
  __syncthreads();
  for (int half = kPartials / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total = lane[0];
}

template <Measure kMeasure, typename Scalar>
void reduce(double* total, double* partials, const Scalar* values, int64_t count, CudaStream stream,
            double factor = 1.0, const double* stored_factor = nullptr) {
  // count 0: every block writes a zero partial, so the total is 0 without a special case.
  partials_kernel<kMeasure><<<kPartials, kThreads, 0, stream>>>(
      partials, detail::device_pointer(values), count, factor, stored_factor);
  CUDA_CHECK(cudaGetLastError());
  final_kernel<<<1, kPartials, 0, stream>>>(total, partials);
  CUDA_CHECK(cudaGetLastError());
}

struct Scale {
  float factor;
  const double* stored_factor;  // replaces factor when not null
  __device__ float operator()(float value, float, int64_t) const {
    return value * (stored_factor != nullptr ? static_cast<float>(*stored_factor) : factor);
  }
};

}  // namespace

template <typename Scalar>
void sum(double* total, double* partials, const Scalar* values, int64_t count, CudaStream stream) {
  reduce<Measure::value>(total, partials, values, count, stream);
}

template <typename Scalar>
void sum_of_squares(double* total, double* partials, const Scalar* values, int64_t count,
                    CudaStream stream) {
  reduce<Measure::square>(total, partials, values, count, stream);
}

template <typename Scalar>
void count_zeros(double* total, double* partials, const Scalar* values, int64_t count,
                 double factor, const double* stored_factor, CudaStream stream) {
  reduce<Measure::zero>(total, partials, values, count, stream, factor, stored_factor);
}

template <typename Scalar>
void scale(Scalar* values, double factor, const double* stored_factor, int64_t count,
           CudaStream stream) {
  // Rounded to float once, as the CPU twin rounds to its element type.
  auto* data = detail::device_pointer(values);
  detail::launch_map(data, data, data, count, Scale{static_cast<float>(factor), stored_factor},
                     stream);
}

template void sum<float>(double*, double*, const float*, int64_t, CudaStream);
template void sum<bfloat16>(double*, double*, const bfloat16*, int64_t, CudaStream);
template void sum<double>(double*, double*, const double*, int64_t, CudaStream);
template void sum_of_squares<float>(double*, double*, const float*, int64_t, CudaStream);
template void sum_of_squares<bfloat16>(double*, double*, const bfloat16*, int64_t, CudaStream);
template void sum_of_squares<double>(double*, double*, const double*, int64_t, CudaStream);
template void count_zeros<float>(double*, double*, const float*, int64_t, double, const double*,
                                 CudaStream);
template void count_zeros<bfloat16>(double*, double*, const bfloat16*, int64_t, double,
                                    const double*, CudaStream);
template void count_zeros<float16>(double*, double*, const float16*, int64_t, double, const double*,
                                   CudaStream);
template void count_zeros<double>(double*, double*, const double*, int64_t, double, const double*,
                                  CudaStream);
template void scale<float>(float*, double, const double*, int64_t, CudaStream);
template void scale<bfloat16>(bfloat16*, double, const double*, int64_t, CudaStream);
template void sum<float16>(double*, double*, const float16*, int64_t, CudaStream);
template void sum_of_squares<float16>(double*, double*, const float16*, int64_t, CudaStream);
template void scale<float16>(float16*, double, const double*, int64_t, CudaStream);

}  // namespace backend::cuda
