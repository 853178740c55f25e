// CUDA twin of rope.hpp (CPU twin: rope_cpu.cpp; Megatron core's non-interleaved rotary
// embedding, rope_utils.py _apply_rotary_pos_emb_bshd):
//   inv_freq[i] = base^(−2i / R),   θ[t, i] = t · inv_freq[i]
//   y[i]        = x[i] · cos θ − x[i + half] · sin θ
//   y[i + half] = x[i + half] · cos θ + x[i] · sin θ          (i < half = R / 2)
// and the backward the inverse rotation (sin θ → −sin θ). The tables are computed in double on
// the device, as the CPU twin does on the host, and rounded once to float, so they match the
// CPU's float tables (CUDA's double pow/sin/cos are within 2 ulp of glibc's: a difference after
// rounding to float needs a double within a few 2^-53 of a float halfway point).
// rope_at_positions_forward is the same kernel reading each row's position from `positions`.
// One thread per (row, head, pair), plus, out of place, one per passed-through feature
// [R, HD). Each pair is read before it is written by the same thread, so output may alias
// input. Elementwise, so deterministic.
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/rope.hpp"

namespace backend::cuda {
namespace {

using detail::from_float;
using detail::grid_stride;
using detail::to_float;

__global__ void rope_tables_kernel(float* cos_table, float* sin_table, int64_t seq_length,
                                   int64_t rotary_dim, double base, RopeScaling scaling) {
  const int64_t half = rotary_dim / 2;
  const int64_t count = seq_length * half;
  for (const int64_t k : grid_stride(count)) {
    const int64_t t = k / half;
    const int64_t i = k % half;
    const double inverse_frequency = scaled_inverse_frequency(
        pow(base, -static_cast<double>(2 * i) / static_cast<double>(rotary_dim)), scaling);
    const double angle = static_cast<double>(t) * inverse_frequency;
    cos_table[k] = static_cast<float>(cos(angle));
    sin_table[k] = static_cast<float>(sin(angle));
  }
}

// sign = +1 rotates by θ (forward), −1 by −θ (backward). Per (row, head): items [0, half)
// rotate pair i; items [half, half + passthrough) copy feature R + (item − half), where
// passthrough is HD − R out of place and 0 in place.
template <typename T>
__global__ void rope_rotate_kernel(T* output, const T* input, const float* cos_table,
                                   const float* sin_table, float sign, int64_t rows,
                                   int64_t seq_length, int64_t num_heads, int64_t head_dim,
                                   int64_t rotary_dim, int64_t row_stride, int64_t passthrough,
                                   const int32_t* positions) {
  const int64_t half = rotary_dim / 2;
  const int64_t per_head = half + passthrough;
  const int64_t count = rows * num_heads * per_head;
  for (const int64_t k : grid_stride(count)) {
    const int64_t item = k % per_head;
    const int64_t head = (k / per_head) % num_heads;
    const int64_t row = k / (per_head * num_heads);
    const int64_t offset = row * row_stride + head * head_dim;
    const T* x = input + offset;
    T* y = output + offset;
    if (item < half) {
      const int64_t position = positions != nullptr ? int64_t{positions[row]} : row % seq_length;
      const int64_t table = position * half + item;
      const float c = cos_table[table];
      const float s = sign * sin_table[table];
      const float first = to_float(x[item]);
      const float second = to_float(x[item + half]);
      y[item] = from_float<T>(first * c - second * s);
      y[item + half] = from_float<T>(second * c + first * s);
    } else {
      const int64_t feature = rotary_dim + (item - half);
      y[feature] = x[feature];
    }
  }
}

template <typename Scalar>
void rotate(Scalar* output, const Scalar* input, const float* cos, const float* sin, float sign,
            int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
            int64_t rotary_dim, int64_t row_stride, CudaStream stream,
            const int32_t* positions = nullptr) {
  const int64_t rows = batch_size * seq_length;
  const int64_t half = rotary_dim / 2;
  const int64_t passthrough = output == input ? 0 : head_dim - rotary_dim;
  const int64_t count = rows * num_heads * (half + passthrough);
  if (count <= 0) return;
  rope_rotate_kernel<<<detail::grid_for(count), detail::kBlockSize, 0, stream>>>(
      detail::device_pointer(output), detail::device_pointer(input), cos, sin, sign, rows,
      seq_length, num_heads, head_dim, rotary_dim, row_stride, passthrough, positions);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_tables(float* cos, float* sin, int64_t seq_length, int64_t rotary_dim, double base,
                 RopeScaling scaling, CudaStream stream) {
  const int64_t count = seq_length * (rotary_dim / 2);
  if (count <= 0) return;
  rope_tables_kernel<<<detail::grid_for(count), detail::kBlockSize, 0, stream>>>(
      cos, sin, seq_length, rotary_dim, base, scaling);
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void rope_forward(Scalar* output, const Scalar* input, const float* cos, const float* sin,
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride, CudaStream stream) {
  rotate(output, input, cos, sin, 1.0f, batch_size, seq_length, num_heads, head_dim, rotary_dim,
         row_stride, stream);
}

template <typename Scalar>
void rope_backward(Scalar* dinput, const Scalar* doutput, const float* cos, const float* sin,
                   int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride, CudaStream stream) {
  rotate(dinput, doutput, cos, sin, -1.0f, batch_size, seq_length, num_heads, head_dim, rotary_dim,
         row_stride, stream);
}

template <typename Scalar>
void rope_at_positions_forward(Scalar* output, const Scalar* input, const float* cos,
                               const float* sin, const int32_t* positions, int64_t rows,
                               int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                               int64_t row_stride, CudaStream stream) {
  rotate(output, input, cos, sin, 1.0f, rows, 1, num_heads, head_dim, rotary_dim, row_stride,
         stream, positions);
}

#define BACKEND_INSTANTIATE_ROPE_CUDA(Scalar)                                                      \
  template void rope_forward<Scalar>(Scalar*, const Scalar*, const float*, const float*, int64_t,  \
                                     int64_t, int64_t, int64_t, int64_t, int64_t, CudaStream);     \
  template void rope_backward<Scalar>(Scalar*, const Scalar*, const float*, const float*, int64_t, \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, CudaStream);    \
  template void rope_at_positions_forward<Scalar>(Scalar*, const Scalar*, const float*,            \
                                                  const float*, const int32_t*, int64_t, int64_t,  \
                                                  int64_t, int64_t, int64_t, CudaStream);
BACKEND_INSTANTIATE_ROPE_CUDA(float)
BACKEND_INSTANTIATE_ROPE_CUDA(bfloat16)
BACKEND_INSTANTIATE_ROPE_CUDA(float16)
#undef BACKEND_INSTANTIATE_ROPE_CUDA

}  // namespace backend::cuda
