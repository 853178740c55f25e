// CPU twin of reduction.hpp.
#include <algorithm>

#include "backend/ops/reduction.hpp"

namespace backend::cpu {

template <typename Scalar>
void sum(double* total, const Scalar* values, int64_t count) {
  double accumulated = 0;
  for (int64_t i = 0; i < count; ++i) accumulated += static_cast<double>(values[i]);
  *total = accumulated;
}

template <typename Scalar>
void sum_of_squares(double* total, const Scalar* values, int64_t count) {
  // The lanes let the sum of squares vectorise; one running double sum was a chain of
  // dependent additions, latency bound at about a tenth of the memory bandwidth (120 ms of a
  // 126M step). Fixed-size chunks make the order independent of the thread count: the chunks'
  // sums are added in chunk order. They are taken kChunksPerPass at a time into an array on
  // the stack, so that the gradient norm of a step allocates nothing.
  constexpr int64_t kChunk = 1 << 16;
  constexpr int64_t kLanes = 16;
  constexpr int64_t kChunksPerPass = 256;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  double accumulated = 0.0;
  for (int64_t pass_begin = 0; pass_begin < chunks; pass_begin += kChunksPerPass) {
    const int64_t pass_chunks = std::min(kChunksPerPass, chunks - pass_begin);
    double partial[kChunksPerPass];
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pass_chunks; ++p) {
      const int64_t begin = (pass_begin + p) * kChunk;
      const int64_t end = std::min(count, begin + kChunk);
      const int64_t whole_end = begin + (end - begin) / kLanes * kLanes;
      double lanes[kLanes] = {};
      for (int64_t i = begin; i < whole_end; i += kLanes) {
#pragma omp simd
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          const auto g = static_cast<double>(values[i + lane]);
          lanes[lane] += g * g;
        }
      }
      for (int64_t i = whole_end; i < end; ++i) {
        const auto g = static_cast<double>(values[i]);
        lanes[i - whole_end] += g * g;
      }
      double lane_sum = 0.0;
      for (const double lane : lanes) lane_sum += lane;
      partial[p] = lane_sum;
    }
    for (int64_t p = 0; p < pass_chunks; ++p) accumulated += partial[p];
  }
  *total = accumulated;
}

template <typename Scalar>
void count_zeros(double* total, const Scalar* values, int64_t count, double factor) {
  const auto rounded = static_cast<Scalar>(factor);  // as scale rounds it
  int64_t zeros = 0;  // an integer: the sum is the same in any order
#pragma omp parallel for simd reduction(+ : zeros) schedule(static)
  for (int64_t i = 0; i < count; ++i) zeros += values[i] * rounded == Scalar{0} ? 1 : 0;
  *total = static_cast<double>(zeros);
}

template <typename Scalar>
void scale(Scalar* values, double factor, int64_t count) {
  const auto rounded = static_cast<Scalar>(factor);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) values[i] *= rounded;
}

template void sum<float>(double*, const float*, int64_t);
template void sum<double>(double*, const double*, int64_t);
template void sum_of_squares<float>(double*, const float*, int64_t);
template void sum_of_squares<double>(double*, const double*, int64_t);
template void count_zeros<float>(double*, const float*, int64_t, double);
template void count_zeros<double>(double*, const double*, int64_t, double);
template void scale<float>(float*, double, int64_t);
template void scale<double>(double*, double, int64_t);

}  // namespace backend::cpu
