// Rotary position embedding (Su et al. 2021, "RoFormer"), Megatron core's non-interleaved form
// (megatron/core/models/common/embeddings/rotary_pos_embedding.py RotaryEmbedding and
// rope_utils.py _apply_rotary_pos_emb_bshd with rotary_interleaved=False), applied to the
// query and key heads after linear_qkv (--position-embedding-type rope).
// The first R = rotary_dim features of a head rotate (R = head_dim × --rotary-percent), the
// rest pass through. With half = R / 2 and position t (0-based within the sequence):
//   inv_freq[i] = base^(−2i / R),   θ[t, i] = t · inv_freq[i]          i ∈ [0, half)
//   emb = cat(θ, θ) (so features i and i + half share an angle)
//   y = x · cos(emb) + rotate_half(x) · sin(emb),   rotate_half(x) = cat(−x[half:R), x[0:half))
// that is, for i < half:
//   y[i]        = x[i] · cos θ − x[i + half] · sin θ
//   y[i + half] = x[i + half] · cos θ + x[i] · sin θ
// Backward: the map is a rotation per pair (i, i + half), so dx is the inverse rotation of dy
// (sin θ → −sin θ); it needs the angles only, never x.
// Llama 3's scaling (Megatron's --use-rope-scaling, its RotaryEmbedding._apply_scaling;
// Hugging Face's rope_type "llama3") replaces inv_freq[i] by scaled_inverse_frequency below:
// with wavelength λ = 2π / inv_freq and L = original_max_position_embeddings, frequencies of
// λ < L / high_frequency_factor stay, those of λ > L / low_frequency_factor are divided by
// factor, and those between are interpolated, s = (L / λ − low) / (high − low):
//   inv_freq' = (1 − s) · inv_freq / factor + s · inv_freq.
// The tables are computed in double and rounded to Scalar (Megatron computes them in fp32).
// Heads: head h of row r (r = b·T + t) starts at element r · row_stride + h · head_dim, so a
// caller can rotate a run of heads inside a wider row (the q and k heads of one query group
// in the fused qkv activation) by offsetting the pointers.
// Contract: no parameters; output/dinput are overwritten (=) on the rotated heads only (the
// other columns of a row are left alone); output may alias input and dinput doutput (each
// pair is read before it is written). Elementwise per pair, so results do not depend on the
// thread count.
// Dimensions: B batch, T sequence, H heads rotated per row, HD head dimension, R rotary
// dimension (even, 0 < R ≤ HD), row_stride ≥ H · HD.
#pragma once

#include <cstdint>

#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend {

// Llama 3's RoPE scaling; factor 0 is none (plain RoPE). Megatron's flags set the factor
// (--rope-scaling-factor) and keep the other three at these values, Llama 3.x's.
struct RopeScaling {
  double factor = 0;
  double low_frequency_factor = 1;
  double high_frequency_factor = 4;
  double original_max_position_embeddings = 8192;

  constexpr bool active() const { return factor != 0; }
  bool operator==(const RopeScaling&) const = default;
};

// inv_freq after the scaling (the formula above); unchanged without it. Arithmetic only, so
// the CUDA twin's kernel calls it too (constexpr, --expt-relaxed-constexpr).
constexpr double scaled_inverse_frequency(double inverse_frequency, const RopeScaling& scaling) {
  if (!scaling.active()) return inverse_frequency;
  constexpr double kTwoPi = 6.283185307179586;
  const double wavelength = kTwoPi / inverse_frequency;
  const double length = scaling.original_max_position_embeddings;
  if (wavelength < length / scaling.high_frequency_factor) return inverse_frequency;
  if (wavelength > length / scaling.low_frequency_factor) return inverse_frequency / scaling.factor;
  const double smooth = (length / wavelength - scaling.low_frequency_factor) /
                        (scaling.high_frequency_factor - scaling.low_frequency_factor);
  return (1 - smooth) * inverse_frequency / scaling.factor + smooth * inverse_frequency;
}

}  // namespace backend

namespace backend::cpu {

template <typename Scalar>
void rope_tables(Scalar* cos,  // (T, R/2)
                 Scalar* sin,  // (T, R/2)
                 int64_t seq_length, int64_t rotary_dim, double base, RopeScaling scaling);

template <typename Scalar>
void rope_forward(Scalar* output,       // rows of row_stride, H heads of HD
                  const Scalar* input,  // the same layout
                  const Scalar* cos,    // (T, R/2) from rope_tables
                  const Scalar* sin,    // (T, R/2)
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride);

template <typename Scalar>
void rope_backward(Scalar* dinput,         // = on the rotated heads
                   const Scalar* doutput,  // gradient of the forward's output
                   const Scalar* cos, const Scalar* sin, int64_t batch_size, int64_t seq_length,
                   int64_t num_heads, int64_t head_dim, int64_t rotary_dim, int64_t row_stride);

// The forward for rows at positions of their own (incremental decoding, model/gpt_decoder.hpp:
// the packed rows of a step are several sequences' tokens at several positions): row r rotates
// by the angles of position positions[r] (< the tables' rows), and is otherwise rope_forward
// with batch_size = N rows of one position each.
template <typename Scalar>
void rope_at_positions_forward(Scalar* output,            // N rows of row_stride
                               const Scalar* input,       // the same layout
                               const Scalar* cos,         // (> max position, R/2)
                               const Scalar* sin,         // (> max position, R/2)
                               const int32_t* positions,  // (N)
                               int64_t rows, int64_t num_heads, int64_t head_dim,
                               int64_t rotary_dim, int64_t row_stride);

}  // namespace backend::cpu

// The CUDA twin (rope_cuda.cu). The tables are float only (the CPU's double angles rounded
// once to float, computed on the device in double the same way); x is float, bfloat16 or float16,
// rotated in float. Same contract and aliasing as the CPU twin.
namespace backend::cuda {

void rope_tables(float* cos,  // (T, R/2)
                 float* sin,  // (T, R/2)
                 int64_t seq_length, int64_t rotary_dim, double base, RopeScaling scaling,
                 CudaStream stream);

template <typename Scalar>
void rope_forward(Scalar* output,       // rows of row_stride, H heads of HD
                  const Scalar* input,  // the same layout
                  const float* cos,     // (T, R/2) from rope_tables
                  const float* sin,     // (T, R/2)
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride, CudaStream stream);

template <typename Scalar>
void rope_backward(Scalar* dinput,         // = on the rotated heads
                   const Scalar* doutput,  // gradient of the forward's output
                   const float* cos, const float* sin, int64_t batch_size, int64_t seq_length,
                   int64_t num_heads, int64_t head_dim, int64_t rotary_dim, int64_t row_stride,
                   CudaStream stream);

template <typename Scalar>
void rope_at_positions_forward(Scalar* output, const Scalar* input, const float* cos,
                               const float* sin, const int32_t* positions, int64_t rows,
                               int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                               int64_t row_stride, CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory; the views start at the first rotated head of a row. The tables
// have the input's type on the CPU (fp32 or fp64) and are fp32 on a GPU.
// rope_at_positions_forward is incremental decoding's: row r at position positions[r] of the
// tables.
namespace backend::ops {

void rope_tables(Device& device, View cos, View sin, int64_t seq_length, int64_t rotary_dim,
                 double base, RopeScaling scaling);
void rope_forward(Device& device, View output, View input, View cos, View sin,
                  int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, int64_t row_stride);
void rope_backward(Device& device, View dinput, View doutput, View cos, View sin,
                   int64_t batch_size, int64_t seq_length, int64_t num_heads, int64_t head_dim,
                   int64_t rotary_dim, int64_t row_stride);
void rope_at_positions_forward(Device& device, View output, View input, View cos, View sin,
                               View positions, int64_t rows, int64_t num_heads,
                               int64_t head_dim, int64_t rotary_dim, int64_t row_stride);

}  // namespace backend::ops
