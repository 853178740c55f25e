// Shared pieces of the backend/ops/*_cuda.cu twins (only .cu files include this: it includes
// CUDA headers): the host element type → CUDA element type map, float conversion, 16-byte
// packs for vector loads, launch sizes and the fixed-order block reductions.
//
// Determinism: every reduction here is a fixed tree over a fixed block size (kBlockSize),
// with no atomics, so a result depends on the inputs and the sizes alone, never on the
// scheduling of blocks or warps. All arithmetic is in float (bf16 and fp16 are read and written
// only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/core/cuda_check.cuh"
#include "backend/core/element_type.hpp"

namespace backend::cuda::detail {

// backend::bfloat16 and backend::float16 (the host names, no CUDA header) are __nv_bfloat16
// and __half in a kernel: same layout.
template <typename Scalar>
struct DeviceElement {
  using type = Scalar;
};
template <>
struct DeviceElement<bfloat16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceElement<float16> {
  using type = __half;
};
template <typename Scalar>
using DeviceElementOf = typename DeviceElement<Scalar>::type;

template <typename Scalar>
DeviceElementOf<Scalar>* device_pointer(Scalar* pointer) {
  return reinterpret_cast<DeviceElementOf<Scalar>*>(pointer);
}
template <typename Scalar>
const DeviceElementOf<Scalar>* device_pointer(const Scalar* pointer) {
  return reinterpret_cast<const DeviceElementOf<Scalar>*>(pointer);
}

__device__ __forceinline__ float to_float(float value) {
  return value;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
__device__ __forceinline__ float to_float(__half value) {
  return __half2float(value);
}

// float → T, rounding to nearest even for bf16 and fp16 (as the host's backend::to_bfloat16 and
// backend::to_float16; fp16 overflows to ±inf from 65520 up).
template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}

// Width elements of T in one 16-byte load or store (4 floats, 8 bf16 or fp16).
template <typename T, int Width>
struct alignas(sizeof(T) * Width) Pack {
  T values[Width];
};
template <typename T>
inline constexpr int kPackWidth = static_cast<int>(16 / sizeof(T));

inline bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Whether a row kernel may load 16-byte packs along rows of C elements: C a multiple of the
// pack and every pointer aligned, so every row starts aligned. (nullptr counts as aligned.)
template <typename T>
bool rows_vectorise(int64_t channels, std::initializer_list<const void*> pointers) {
  if (channels % kPackWidth<T> != 0) return false;
  for (const void* pointer : pointers) {
    if (!aligned_16(pointer)) return false;
  }
  return true;
}

// Width consecutive elements at `pointer` (aligned to the pack when Width > 1) as floats, and
// back (rounded once per element).
template <int Width, typename T>
__device__ __forceinline__ void load_floats(float (&values)[Width], const T* pointer) {
  const Pack<T, Width> pack = *reinterpret_cast<const Pack<T, Width>*>(pointer);
#pragma unroll
  for (int j = 0; j < Width; ++j) values[j] = to_float(pack.values[j]);
}
template <int Width, typename T>
__device__ __forceinline__ void store_floats(T* pointer, const float (&values)[Width]) {
  Pack<T, Width> pack;
#pragma unroll
  for (int j = 0; j < Width; ++j) pack.values[j] = from_float<T>(values[j]);
  *reinterpret_cast<Pack<T, Width>*>(pointer) = pack;
}

// Threads per block of every kernel here. The reductions' order depends on it, so it is a
// constant, not a tuning knob picked at run time.
inline constexpr int kBlockSize = 256;
// Grid-stride loops cover any size; this many blocks fill an H100 (132 SMs) several times.
inline constexpr int64_t kMaxBlocks = 8192;

inline unsigned grid_for(int64_t work_items) {
  const int64_t blocks = (work_items + kBlockSize - 1) / kBlockSize;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

// ---- grid-stride loops
// `for (const int64_t i : grid_stride(count))` visits this thread's share of [0, count): its
// index in the grid, then steps of the whole grid. A range rather than a function taking the
// body, so the body stays in the kernel and nvcc unrolls its inner loops as it did before.
class GridStride {
 public:
  struct End {};
  class Iterator {
   public:
    __device__ Iterator(int64_t index, int64_t stride, int64_t count)
        : index_(index), stride_(stride), count_(count) {}
    __device__ int64_t operator*() const { return index_; }
    __device__ Iterator& operator++() {
      index_ += stride_;
      return *this;
    }
    __device__ bool operator!=(End) const { return index_ < count_; }

   private:
    int64_t index_;
    int64_t stride_;
    int64_t count_;
  };
  __device__ explicit GridStride(int64_t count) : count_(count) {}
  __device__ Iterator begin() const {
    return {static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
            static_cast<int64_t>(gridDim.x) * blockDim.x, count_};
  }
  __device__ End end() const { return {}; }

 private:
  int64_t count_;
};
__device__ __forceinline__ GridStride grid_stride(int64_t count) {
  return GridStride(count);
}

// Rows of `columns` elements walked Width at a time (columns a multiple of Width): a position
// is a row and the first of its Width columns. `for (const RowPack at : grid_stride_packs<W>(
// rows, columns))` gives each thread its share of the rows × columns / W packs.
struct RowPack {
  int64_t row;
  int64_t column;
};
template <int Width>
class GridStridePacks {
 public:
  class Iterator {
   public:
    __device__ Iterator(GridStride::Iterator pack, int64_t packs_per_row)
        : pack_(pack), packs_per_row_(packs_per_row) {}
    __device__ RowPack operator*() const {
      return {*pack_ / packs_per_row_, (*pack_ % packs_per_row_) * Width};
    }
    __device__ Iterator& operator++() {
      ++pack_;
      return *this;
    }
    __device__ bool operator!=(GridStride::End end) const { return pack_ != end; }

   private:
    GridStride::Iterator pack_;
    int64_t packs_per_row_;
  };
  __device__ GridStridePacks(int64_t rows, int64_t columns)
      : packs_per_row_(columns / Width), packs_(rows * packs_per_row_) {}
  __device__ Iterator begin() const { return {packs_.begin(), packs_per_row_}; }
  __device__ GridStride::End end() const { return {}; }

 private:
  int64_t packs_per_row_;
  GridStride packs_;
};
template <int Width>
__device__ __forceinline__ GridStridePacks<Width> grid_stride_packs(int64_t rows, int64_t columns) {
  return GridStridePacks<Width>(rows, columns);
}

// Sum over a warp by an xor butterfly: every lane ends with the same bits (each step adds the
// same two values, in either order, and float addition is commutative).
__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum of one value per thread over the block (blockDim.x a multiple of 32, at most 1024),
// returned to every thread. Warps reduce, then every warp reduces the warps' sums in the same
// order, so all threads hold identical bits. `shared` holds 32 floats; the closing barrier
// lets the caller reuse it at once.
__device__ __forceinline__ float block_sum(float value, float* shared) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  value = warp_sum(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const float total = warp_sum(lane < warps ? shared[lane] : 0.0f);
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float value, float* shared) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  value = warp_max(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const float total = warp_max(lane < warps ? shared[lane] : -INFINITY);
  __syncthreads();
  return total;
}

// ---- column sums of the norms' parameter gradients
// Σ over rows of a (rows, C) product, without atomics: the rows are cut into row_groups(rows)
// fixed groups of consecutive rows; one pass writes each group's per-column partial sums (rows
// in order) into scratch, a second adds the partials in group order. The grouping depends on
// the row count alone, so the result is the same bits on every run and every GPU.
inline constexpr int64_t kMaxRowGroups = 256;
inline constexpr int64_t kMinRowsPerGroup = 32;

inline int64_t row_groups(int64_t rows) {
  return std::clamp<int64_t>((rows + kMinRowsPerGroup - 1) / kMinRowsPerGroup, 1, kMaxRowGroups);
}
inline int64_t rows_per_group(int64_t rows) {
  const int64_t groups = row_groups(rows);
  return (rows + groups - 1) / groups;
}

// The column sums themselves, for any number of sums over the same rows (the layer norm's
// weight and bias gradients: two; the RMS norm's weight gradient: one). Terms has
//   static constexpr int kSums;
//   __device__ void add(int64_t row, int64_t column, float (&sums)[kSums]) const;
// adding one row's terms of one column. scratch holds (kSums, row_groups, C) floats:
// column_sums_scratch_floats.
template <int Sums>
struct ColumnTargets {
  float* columns[Sums];  // (C) each, +=
};

inline int64_t column_sums_scratch_floats(int sums, int64_t rows, int64_t channels) {
  return sums * row_groups(rows) * channels;
}

// One row group (blockIdx.y) of every column, rows in order; a thread per column (coalesced
// along the row).
template <typename Terms>
__global__ void column_partials_kernel(float* scratch, Terms terms, int64_t rows,
                                       int64_t channels, int64_t group_rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int64_t group = blockIdx.y;
  const int64_t groups = gridDim.y;
  const int64_t begin = group * group_rows;
  const int64_t end = begin + group_rows < rows ? begin + group_rows : rows;
  float sums[Terms::kSums] = {};
  for (int64_t row = begin; row < end; ++row) terms.add(row, c, sums);
#pragma unroll
  for (int k = 0; k < Terms::kSums; ++k) scratch[(k * groups + group) * channels + c] = sums[k];
}

// targets[k][c] += Σ_g partial[k, g, c] in group order.
template <int Sums>
__global__ void column_finish_kernel(ColumnTargets<Sums> targets, const float* scratch,
                                     int64_t channels, int64_t groups) {
  for (const int64_t c : grid_stride(channels)) {
    float sums[Sums] = {};
    for (int64_t group = 0; group < groups; ++group) {
#pragma unroll
      for (int k = 0; k < Sums; ++k) sums[k] += scratch[(k * groups + group) * channels + c];
    }
#pragma unroll
    for (int k = 0; k < Sums; ++k) targets.columns[k][c] += sums[k];
  }
}

template <typename Terms>
void launch_column_sums(const ColumnTargets<Terms::kSums>& targets, const Terms& terms,
                        float* scratch, int64_t rows, int64_t channels, cudaStream_t stream) {
  const int64_t groups = row_groups(rows);
  const dim3 partial_grid(static_cast<unsigned>((channels + kBlockSize - 1) / kBlockSize),
                          static_cast<unsigned>(groups));
  column_partials_kernel<<<partial_grid, kBlockSize, 0, stream>>>(scratch, terms, rows, channels,
                                                                   rows_per_group(rows));
  CUDA_CHECK(cudaGetLastError());
  column_finish_kernel<Terms::kSums><<<grid_for(channels), kBlockSize, 0, stream>>>(
      targets, scratch, channels, groups);
  CUDA_CHECK(cudaGetLastError());
}

// ---- one block per row
// The norms' kernels: a block walks its rows (row = blockIdx.x, stepping by the grid), and each
// thread the row's channels, Width consecutive ones at a time (one 16-byte pack when Width > 1,
// which launch_with_pack_width picks only when rows_vectorise allows, so each row starts aligned),
// stepping by the block.
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, int64_t{1} << 20));
}

template <typename Visit>
__device__ __forceinline__ void for_each_row(int64_t rows, Visit&& visit) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) visit(row);
}

template <int Width, typename Visit>
__device__ __forceinline__ void for_each_pack_of_row(int64_t channels, Visit&& visit) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * Width;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * Width; c < channels; c += step) visit(c);
}

// launch(std::integral_constant<int, Width>{}) launches the kernel of that Width (over the grid
// the launch picks; the norms' is row_grid(rows) blocks of kBlockSize): the 16-byte pack where
// rows of C elements and every pointer allow it (rows_vectorise), else 1.
template <typename T, typename Launch>
void launch_with_pack_width(int64_t channels, std::initializer_list<const void*> pointers,
                            Launch&& launch) {
  if (rows_vectorise<T>(channels, pointers)) {
    launch(std::integral_constant<int, kPackWidth<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
  CUDA_CHECK(cudaGetLastError());
}

// ---- elementwise maps
// output[i] = op(a[i], b[i], i) over N elements, in float. Each thread takes one 16-byte pack
// of every operand when all pointers are 16-byte aligned (Width = kPackWidth), else single
// elements (Width = 1); the last, partial pack is done element by element. A thread reads its
// pack before writing it, so output may alias a or b. Unary ops pass b = a and ignore it.
template <typename T, int Width, typename Op>
__global__ void map_kernel(T* output, const T* a, const T* b, int64_t count, Op op) {
  using P = Pack<T, Width>;
  const int64_t packs = (count + Width - 1) / Width;
  for (const int64_t p : grid_stride(packs)) {
    const int64_t first = p * Width;
    if (first + Width <= count) {
      const P a_pack = *reinterpret_cast<const P*>(a + first);
      const P b_pack = *reinterpret_cast<const P*>(b + first);
      P out;
#pragma unroll
      for (int j = 0; j < Width; ++j) {
        out.values[j] =
            from_float<T>(op(to_float(a_pack.values[j]), to_float(b_pack.values[j]), first + j));
      }
      *reinterpret_cast<P*>(output + first) = out;
    } else {
      for (int64_t i = first; i < count; ++i) {
        output[i] = from_float<T>(op(to_float(a[i]), to_float(b[i]), i));
      }
    }
  }
}

template <typename T, typename Op>
void launch_map(T* output, const T* a, const T* b, int64_t count, Op op, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr int kWidth = kPackWidth<T>;
  if (aligned_16(output) && aligned_16(a) && aligned_16(b)) {
    map_kernel<T, kWidth><<<grid_for((count + kWidth - 1) / kWidth), kBlockSize, 0, stream>>>(
        output, a, b, count, op);
  } else {
    map_kernel<T, 1><<<grid_for(count), kBlockSize, 0, stream>>>(output, a, b, count, op);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace backend::cuda::detail
