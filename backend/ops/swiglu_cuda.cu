// CUDA twin of swiglu.hpp (CPU twin: swiglu_cpu.cpp): Megatron's SwiGLU over rows of
// [a | b] (torch.chunk(y, 2, dim=-1)),
//   h = silu(a) · b = a · σ(a) · b,   σ(a) = 1 / (1 + exp(−a))
//   da = dh · b · σ(a) · (1 + a · (1 − σ(a))),   db = dh · silu(a)
// in float with CUDA's accurate expf (the CPU float path uses its own fast_exp: a few ulp
// apart). One thread per output element (row, f), or per 16-byte pack of features when F is a
// multiple of the pack width and every pointer is 16-byte aligned (then no pack crosses a row
// or the a/b boundary). Elementwise, so deterministic.
#include "backend/ops/cuda_common.cuh"
#include "backend/ops/swiglu.hpp"

namespace backend::cuda {
namespace {

using detail::from_float;
using detail::grid_stride_packs;
using detail::Pack;
using detail::to_float;

// For a → −∞, exp(−a) is +∞ and σ = 0, the limit.
__device__ __forceinline__ float sigmoid(float a) {
  return 1.0f / (1.0f + expf(-a));
}

template <typename T, int Width>
__global__ void swiglu_forward_kernel(T* output, const T* input, int64_t rows, int64_t features) {
  using P = Pack<T, Width>;
  for (const auto [row, f] : grid_stride_packs<Width>(rows, features)) {
    const T* gate = input + row * 2 * features + f;
    const P a = *reinterpret_cast<const P*>(gate);
    const P b = *reinterpret_cast<const P*>(gate + features);
    P h;
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      const float x = to_float(a.values[j]);
      h.values[j] = from_float<T>(x * sigmoid(x) * to_float(b.values[j]));
    }
    *reinterpret_cast<P*>(output + row * features + f) = h;
  }
}

template <typename T, int Width>
__global__ void swiglu_backward_kernel(T* dinput, const T* doutput, const T* input, int64_t rows,
                                       int64_t features) {
  using P = Pack<T, Width>;
  for (const auto [row, f] : grid_stride_packs<Width>(rows, features)) {
    const int64_t gate_offset = row * 2 * features + f;
    const P a = *reinterpret_cast<const P*>(input + gate_offset);
    const P b = *reinterpret_cast<const P*>(input + gate_offset + features);
    const P dh = *reinterpret_cast<const P*>(doutput + row * features + f);
    P da;
    P db;
#pragma unroll
    for (int j = 0; j < Width; ++j) {
      const float x = to_float(a.values[j]);
      const float s = sigmoid(x);
      const float g = to_float(dh.values[j]);
      da.values[j] = from_float<T>(g * to_float(b.values[j]) * s * (1.0f + x * (1.0f - s)));
      db.values[j] = from_float<T>(g * x * s);
    }
    *reinterpret_cast<P*>(dinput + gate_offset) = da;
    *reinterpret_cast<P*>(dinput + gate_offset + features) = db;
  }
}

}  // namespace

template <typename Scalar>
void swiglu_forward(Scalar* output, const Scalar* input, int64_t rows, int64_t features,
                    CudaStream stream) {
  if (rows <= 0 || features <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* out = detail::device_pointer(output);
  const T* in = detail::device_pointer(input);
  detail::launch_with_pack_width<T>(features, {out, in}, [&](auto width) {
    swiglu_forward_kernel<T, width>
        <<<detail::grid_for(rows * features / width), detail::kBlockSize, 0, stream>>>(
            out, in, rows, features);
  });
}

template <typename Scalar>
void swiglu_backward(Scalar* dinput, const Scalar* doutput, const Scalar* input, int64_t rows,
                     int64_t features, CudaStream stream) {
  if (rows <= 0 || features <= 0) return;
  using T = detail::DeviceElementOf<Scalar>;
  T* din = detail::device_pointer(dinput);
  const T* dout = detail::device_pointer(doutput);
  const T* in = detail::device_pointer(input);
  detail::launch_with_pack_width<T>(features, {din, dout, in}, [&](auto width) {
    swiglu_backward_kernel<T, width>
        <<<detail::grid_for(rows * features / width), detail::kBlockSize, 0, stream>>>(
            din, dout, in, rows, features);
  });
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t, CudaStream);
template void swiglu_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t, int64_t, CudaStream);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int64_t,
                                     CudaStream);
template void swiglu_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t,
                                        int64_t, CudaStream);
template void swiglu_forward<float16>(float16*, const float16*, int64_t, int64_t, CudaStream);
template void swiglu_backward<float16>(float16*, const float16*, const float16*, int64_t,
                                       int64_t, CudaStream);

}  // namespace backend::cuda
