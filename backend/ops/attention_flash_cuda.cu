// CUDA twin of attention.hpp on tensor cores, bf16 and fp16 (attention.hpp's flash_attention_*):
// the same causal GQA attention, qkv layout, dropout mask elements ((b·NH + h)·T + i)·T + j and
// fp32 log-sum-exp as attention_cuda.cu, with every matrix product an
// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (sm_80 and later): 16-bit
// operands of the qkv's type, fp32 accumulators. FlashAttention-2's partition (Dao 2023, Algorithms
// 1 and 2; §3.3 "work partitioning between warps"): a thread block of four warps owns 64 rows, each
// warp 16 of them (the mma's M), so the online softmax's row statistics stay within the four
// threads of a quad that hold a row's accumulators (PTX ISA, "Matrix fragments for mma.m16n8k16":
// thread lane holds rows lane/4 and lane/4 + 8, columns 2·(lane%4) and +1 of each 8-column n-tile).
//
// Kernels (kThreads threads, 64 rows × head dimension HD ∈ {64, 128} as a template constant):
//   forward  per (b, h, query tile): S = Q·K^T per key tile at or below the diagonal, online
//            softmax in registers (in log2 units: exp2 of S·scale·log2 e), P rounded to E and
//            reused from the accumulator registers as the A operand of O += P·V.
//   dQ       per (b, h, query tile): S and dP = dO·V^T per key tile, dS = P ∘ (dP·mask − Δ),
//            dQ += dS·K.
//   dK, dV   per (b, group, key tile), each warp 16 keys: over the group's heads and the query
//            tiles at or below the diagonal, in chunks of 16 queries, S^T = K·Q^T and
//            dP^T = V·dO^T, then dV += (P∘mask)^T·dO and dK += dS^T·Q.
// As in attention_cuda.cu every output element has one owner summing in loop order (row sums
// across a quad are fixed xor shuffles), so results are the same bits run after run: no atomics,
// no scratch. Shared tiles are the rows as they are in memory, 16-bit, padded by 8 elements
// (16 bytes), so the eight 16-byte rows an `ldmatrix` phase reads fall in 32 distinct banks.
// Tiles are copied in with `cp.async` (16 bytes a thread, zeros past T) and double buffered:
// the next key tile (forward, dQ) or query tile (dK, dV) is in flight while the products of the
// current one run, one barrier per tile (FlashAttention-2's pipelining of its K/V loads; a
// GPU whose shared memory cannot hold two stages gets one, chosen at launch). Fragments come
// from shared memory through `ldmatrix` (PTX ISA, "Warp-level matrix load instruction:
// ldmatrix"): A operands and the B operands stored [n][k] (K for S = Q·Kᵀ, V for dP = dO·Vᵀ,
// Q and dO for Sᵀ and dPᵀ) plain, the B operands stored [k][n] (V for P·V, K for dS·K, Q and dO
// for dK and dV) with `.trans`, which transposes each 8×8 matrix on the way into registers.
// Differences from attention_cuda.cu are rounding only: P and dS enter their products in the
// qkv's 16-bit type E (__nv_bfloat16 or __half; P ≤ 1, and dS scales with the output gradient,
// which fp16 training keeps in range with its loss scale, as it does every activation gradient).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/ops/attention.hpp"

namespace backend::cuda {
namespace {

constexpr int kRows = 64;                  // query rows (forward, dQ) or keys (dK, dV) of a block
constexpr int kWarps = kRows / 16;         // 16 rows per warp: the mma's M
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // 2-byte elements: 16 bytes
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The kernels' element type for the host's (same layout).
template <typename Scalar>
using DeviceElement = std::conditional_t<std::is_same_v<Scalar, bfloat16>, __nv_bfloat16, __half>;

struct FlashShape {
  int64_t T, NH, heads_per_group, row_width, hidden;
  float scale;       // 1/sqrt(HD)
  float scale_log2;  // scale · log2 e
  bool drop;
  uint64_t key, threshold;
  const uint64_t* stored_key;  // Dropout::stored_key: the key read from device memory
  float dropout_scale;

  __device__ int64_t group_column(int64_t group, int HD) const {
    return group * (heads_per_group + 2) * HD;
  }
  __device__ int64_t query_column(int64_t h, int HD) const {
    return group_column(h / heads_per_group, HD) + (h % heads_per_group) * HD;
  }
  __device__ int64_t key_column(int64_t group, int HD) const {
    return group_column(group, HD) + heads_per_group * HD;
  }
  // keep ? 1/(1 − p) : 0 for element (pair, i, j) of the mask; 1 without dropout.
  __device__ float multiplier(int64_t pair, int64_t i, int64_t j) const {
    if (!drop) return 1.0f;
    const auto index = static_cast<uint64_t>((pair * T + i) * T + j);
    const uint64_t mask_key = stored_key != nullptr ? *stored_key : key;
    return dropout_keep(mask_key, index, threshold) ? dropout_scale : 0.0f;
  }
};

static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2, "kPad counts 2-byte elements");

// D = A·B + D for one 16×8×16 product of E operands (the fragments' layout: PTX ISA,
// mma.m16n8k16; the same for bf16 and f16).
template <typename E>
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<E, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<E, __nv_bfloat16>, "tensor-core attention is bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ inline float element_to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
__device__ inline float element_to_float(__half value) { return __half2float(value); }

// Two floats as one E×2 register (rounded to nearest even), `low` in the lower half (the lower
// column).
template <typename E>
__device__ inline uint32_t pack(float low, float high) {
  uint32_t word;
  if constexpr (std::is_same_v<E, __half>) {
    const __half2 pair = __floats2half2_rn(low, high);
    memcpy(&word, &pair, sizeof word);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    memcpy(&word, &pair, sizeof word);
  }
  return word;
}

__device__ inline int lane_group() { return static_cast<int>(threadIdx.x % 32) / 4; }
__device__ inline int lane_in_group() { return static_cast<int>(threadIdx.x % 4); }

// ---- shared memory in and out: cp.async and ldmatrix (sm_80 and later) ------------------

// 16 bytes from global to shared memory, asynchronously (`cp.async.cg`: through L2 only, as each
// tile is read once per block); `valid` false writes 16 zero bytes (source size 0: nothing is
// read). The copies a thread issues between two commit_copies() form a group.
__device__ inline void copy_16_async(void* shared, const void* global, bool valid) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ inline void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `Pending` of this thread's newest groups are in flight; the other threads'
// copies are seen after a __syncthreads() that follows.
template <int Pending>
__device__ inline void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8×8 matrices of 16-bit elements: lane l gives the address of row l % 8 of matrix l / 8 (16
// bytes, 16-byte aligned) and receives, of matrix m, in r[m] the elements (row l/4, columns 2·(l%4)
// and +1), or with Transposed the elements (rows 2·(l%4) and +1, column l/4).
template <bool Transposed>
__device__ inline void load_matrices(uint32_t (&r)[4], const void* row) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (Transposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
}

__device__ inline int lane() {
  return static_cast<int>(threadIdx.x % 32);
}

// A operand (16×16) at (row0, col0) of a row-major tile with `pitch`: matrices (rows 0-7,
// columns 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a0a1, a2a3, a4a5, a6a7 (PTX ISA,
// mma.m16n8k16's A fragment: (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)).
template <typename E>
__device__ inline void load_a(uint32_t (&a)[4], const E* tile, int pitch, int row0, int col0) {
  load_matrices<false>(a, tile + (row0 + lane() % 16) * pitch + col0 + (lane() / 16) * 8);
}

// B operands (16×8, k × n) of the two n-tiles n0 and n0 + 8 at k0, from a tile stored [n][k]
// with `pitch`: b[0], b[1] of n-tile n0 (b0b1 (k 2t, n g), b2b3 (k 2t + 8, n g)), b[2], b[3]
// of n0 + 8.
template <typename E>
__device__ inline void load_b_pair(uint32_t (&b)[4], const E* tile, int pitch, int n0, int k0) {
  load_matrices<false>(
      b, tile + (n0 + lane() % 8 + (lane() / 16) * 8) * pitch + k0 + ((lane() / 8) % 2) * 8);
}

// The same from a tile stored [k][n] (rows as they are in memory: V for P·V, K for dS·K, dO and
// Q for dV and dK), transposed by ldmatrix.
template <typename E>
__device__ inline void load_b_pair_transposed(uint32_t (&b)[4], const E* tile, int pitch, int n0,
                                              int k0) {
  load_matrices<true>(
      b, tile + (k0 + lane() % 8 + ((lane() / 8) % 2) * 8) * pitch + n0 + (lane() / 16) * 8);
}

// The A operand (16 rows × 16 columns 16·kk…) from accumulators of two n-tiles 2kk, 2kk + 1
// (the C layout of one equals half of the A layout: FlashAttention-2's register reuse).
template <typename E>
__device__ inline void accumulators_as_a(uint32_t (&a)[4], const float (&low)[4],
                                         const float (&high)[4]) {
  a[0] = pack<E>(low[0], low[1]);
  a[1] = pack<E>(low[2], low[3]);
  a[2] = pack<E>(high[0], high[1]);
  a[3] = pack<E>(high[2], high[3]);
}

// out (16 × 8·NTiles) = rows left_row0… of `left` · (rows right_row0… of `right`)^T, both
// tiles row-major with HD columns (pitch HD + kPad): S = Q·K^T, dP = dO·V^T and their
// transposes.
template <int HD, int NTiles, typename E>
__device__ inline void product_with_transpose(float (&out)[NTiles][4], const E* left,
                                              int left_row0, const E* right, int right_row0) {
#pragma unroll
  for (int n = 0; n < NTiles; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  static_assert(NTiles % 2 == 0, "B operands are loaded two n-tiles at a time");
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    load_a(a, left, HD + kPad, left_row0, kk * 16);
#pragma unroll
    for (int n = 0; n < NTiles; n += 2) {
      uint32_t b[4];
      load_b_pair(b, right, HD + kPad, right_row0 + n * 8, kk * 16);
      mma<E>(out[n], a, b[0], b[1]);
      mma<E>(out[n + 1], a, b[2], b[3]);
    }
  }
}

// sum (16 × HD) += weights (16 × 16·KSteps, accumulator registers, rounded to E) · rows
// k0… of a row-major tile with HD columns: O += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q.
template <int HD, int KSteps, typename E>
__device__ inline void accumulate_product(float (&sum)[HD / 8][4],
                                          const float (&weights)[2 * KSteps][4], const E* rows,
                                          int k0) {
#pragma unroll
  for (int kk = 0; kk < KSteps; ++kk) {
    uint32_t a[4];
    accumulators_as_a<E>(a, weights[2 * kk], weights[2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      uint32_t b[4];
      load_b_pair_transposed(b, rows, HD + kPad, n * 8, k0 + kk * 16);
      mma<E>(sum[n], a, b[0], b[1]);
      mma<E>(sum[n + 1], a, b[2], b[3]);
    }
  }
}

// Row `half` (0: lane_group(), 1: lane_group() + 8) of a 16 × HD accumulator, times `factor`,
// as E pairs at row + 2·lane_in_group() + 8·n: the lane's columns.
template <int HD, typename E>
__device__ inline void store_row(E* row, const float (&sum)[HD / 8][4], int half, float factor) {
  E* out = row + 2 * lane_in_group();
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    *reinterpret_cast<uint32_t*>(out + n * 8) =
        pack<E>(sum[n][2 * half] * factor, sum[n][2 * half + 1] * factor);
  }
}

// Rows row0… of a (T, ·) matrix with `stride` into tile[r][d] (pitch HD + kPad) by cp.async,
// zeros past T; the caller commits and waits. A warp copies consecutive 16-byte pieces of a row.
template <int HD, typename E>
__device__ void copy_rows_async(E* tile, const E* source, int64_t stride, int64_t row0, int64_t T) {
  constexpr int pieces = HD / 8;
  for (int e = threadIdx.x; e < kRows * pieces; e += kThreads) {
    const int r = e / pieces, c = (e % pieces) * 8;
    const bool inside = row0 + r < T;
    // Past T nothing is read; the address stays one inside the matrix.
    copy_16_async(tile + r * (HD + kPad) + c, inside ? source + (row0 + r) * stride + c : source,
                  inside);
  }
}

// A group's key tile at k0 (its K and V rows) into k and v.
template <int HD, typename E>
__device__ void copy_keys_async(E* k, E* v, const E* batch, int64_t key_col, int64_t k0,
                                const FlashShape& shape) {
  copy_rows_async<HD>(k, batch + key_col, shape.row_width, k0, shape.T);
  copy_rows_async<HD>(v, batch + key_col + HD, shape.row_width, k0, shape.T);
}

// Head h's query tile at q0 (its Q rows and its output gradient's rows) into q and dout.
template <int HD, typename E>
__device__ void copy_queries_async(E* q, E* dout, const E* batch, const E* doutput, int64_t b,
                                   int64_t h, int64_t q0, const FlashShape& shape) {
  copy_rows_async<HD>(q, batch + shape.query_column(h, HD), shape.row_width, q0, shape.T);
  copy_rows_async<HD>(dout, doutput + b * shape.T * shape.hidden + h * HD, shape.hidden, q0,
                      shape.T);
}

__device__ inline float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ inline float quad_sum(float value) {  // the same two steps every time: fixed order
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}
__device__ inline float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// L·log2 e and Δ = Σ_d dO·O of the 64 query rows q0… (dO in shared memory, O in global).
template <int HD, typename E>
__device__ void load_row_statistics(float* row_logsumexp_log2, float* row_delta,
                                    const E* dout, const E* output,
                                    const float* logsumexp, int64_t b, int64_t h, int64_t q0,
                                    const FlashShape& shape) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kRows; r += kWarps) {
    const int64_t i = q0 + r;
    float partial = 0.0f;
    if (i < shape.T) {
      const E* o = output + (b * shape.T + i) * shape.hidden + h * HD;
      for (int d = lane; d < HD; d += 32) {
        partial += element_to_float(dout[r * (HD + kPad) + d]) * element_to_float(o[d]);
      }
    }
    const float delta = warp_sum(partial);
    if (lane == 0) {
      row_delta[r] = delta;
      row_logsumexp_log2[r] =
          i < shape.T ? logsumexp[(b * shape.NH + h) * shape.T + i] * kLog2e : 0.0f;
    }
  }
}

// What a forward or dQ block owns: head pair b·NH + h and a query tile, the longest first;
// the batch's qkv rows and the column of the head's group's keys.
template <typename E>
struct QueryTileUnit {
  int64_t pair, b, h, query_tile, q0;
  const E* batch;
  int64_t key_col;
};

template <int HD, typename E>
__device__ inline QueryTileUnit<E> query_tile_unit(const E* qkv, const FlashShape& shape) {
  const int64_t pair = blockIdx.y;
  const int64_t b = pair / shape.NH, h = pair % shape.NH;
  const int64_t tiles = (shape.T + kRows - 1) / kRows;
  const int64_t query_tile = tiles - 1 - blockIdx.x;
  return {pair,
          b,
          h,
          query_tile,
          query_tile * kRows,
          qkv + b * shape.T * shape.row_width,
          shape.key_column(h / shape.heads_per_group, HD)};
}

// ---- shared memory ------------------------------------------------------------------------

template <int HD>
constexpr size_t rows_tile_elements = size_t{kRows} * (HD + kPad);  // [row][HD + kPad]

// A kernel's dynamic shared memory, carved in one order by the kernel and sized for its launch
// by the same function: with a null base the carve only counts bytes (the host side). Each
// call below takes its tiles in the order of its arguments.
struct SharedCarve {
  unsigned char* base = nullptr;
  size_t used = 0;
  template <typename T>
  __host__ __device__ T* take(size_t count) {
    T* at = base == nullptr ? nullptr : reinterpret_cast<T*>(base + used);
    used += count * sizeof(T);
    return at;
  }
  template <int HD, typename... E>
  __host__ __device__ void row_tiles(E*&... tiles) {
    ((tiles = take<E>(rows_tile_elements<HD>)), ...);
  }
  // One float per row of the tile: the softmax statistics.
  __host__ __device__ void row_statistics(float*& logsumexp_log2, float*& delta) {
    logsumexp_log2 = take<float>(kRows);
    delta = take<float>(kRows);
  }
};

// The tiles a kernel streams come in `stages` (1 or 2) buffers each: with two, the next tile is
// copied in while the current one is used.
template <typename E>
struct Staged {
  E *even, *odd;  // a select, not an indexed array: that would live in local memory
  __device__ E* operator[](int64_t step) const { return (step & 1) != 0 ? odd : even; }
};

template <int HD, typename E>
__host__ __device__ inline Staged<E> staged_tiles(SharedCarve& carve, int stages) {
  Staged<E> tiles{};
  carve.row_tiles<HD>(tiles.even);
  tiles.odd = tiles.even;
  if (stages == 2) carve.row_tiles<HD>(tiles.odd);
  return tiles;
}

template <typename E>
struct ForwardTiles {
  E* q;
  Staged<E> k, v;
};
template <int HD, typename E>
__host__ __device__ inline ForwardTiles<E> carve_forward(SharedCarve& carve, int stages) {
  ForwardTiles<E> tiles{};
  carve.row_tiles<HD>(tiles.q);
  tiles.k = staged_tiles<HD, E>(carve, stages);
  tiles.v = staged_tiles<HD, E>(carve, stages);
  return tiles;
}

template <typename E>
struct DqTiles {
  E *q, *dout;
  Staged<E> k, v;
  float *row_logsumexp_log2, *row_delta;
};
template <int HD, typename E>
__host__ __device__ inline DqTiles<E> carve_dq(SharedCarve& carve, int stages) {
  DqTiles<E> tiles{};
  carve.row_tiles<HD>(tiles.q, tiles.dout);
  tiles.k = staged_tiles<HD, E>(carve, stages);
  tiles.v = staged_tiles<HD, E>(carve, stages);
  carve.row_statistics(tiles.row_logsumexp_log2, tiles.row_delta);
  return tiles;
}

template <typename E>
struct DkDvTiles {
  E *k, *v;
  Staged<E> q, dout;
  float *row_logsumexp_log2, *row_delta;
};
template <int HD, typename E>
__host__ __device__ inline DkDvTiles<E> carve_dkdv(SharedCarve& carve, int stages) {
  DkDvTiles<E> tiles{};
  carve.row_tiles<HD>(tiles.k, tiles.v);
  tiles.q = staged_tiles<HD, E>(carve, stages);
  tiles.dout = staged_tiles<HD, E>(carve, stages);
  carve.row_statistics(tiles.row_logsumexp_log2, tiles.row_delta);
  return tiles;
}

// The bytes a launch gives a kernel whose carve is `Carve`, at `stages`.
template <typename Carve>
inline size_t shared_bytes_of(Carve carve, int stages) {
  SharedCarve counting;
  carve(counting, stages);
  return counting.used;
}

// Step `step` of a kernel's stream of tiles (one buffer each of `tiles`), its copies in flight
// until begin_step: with two stages the next step's copies are issued once every thread is past
// the step before (whose buffers they overwrite), so they run under this step's products.
// `copy(step)` issues one step's copies. Every thread calls it with the same steps.
template <typename Copy>
__device__ inline void begin_step(int64_t step, int64_t steps, int stages, const Copy& copy) {
  if (stages == 1 && step > 0) {
    __syncthreads();  // the previous step's tiles are read
    copy(step);
    commit_copies();
  }
  wait_copies<0>();
  __syncthreads();  // every thread's copies of this step have landed; the last step is read
  if (stages == 2 && step + 1 < steps) {
    copy(step + 1);
    commit_copies();
  }
}

// ---- forward ------------------------------------------------------------------------------

template <int HD, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(E* output, float* logsumexp, const E* qkv, FlashShape shape, int stages) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedCarve carve{shared_bytes};
  const auto [q, k, v] = carve_forward<HD, E>(carve, stages);

  const auto [pair, b, h, query_tile, q0, batch, key_col] = query_tile_unit<HD>(qkv, shape);
  const int warp_row = (threadIdx.x / 32) * 16;
  const int t = lane_in_group();
  const int64_t rows[2] = {q0 + warp_row + lane_group(), q0 + warp_row + lane_group() + 8};
  const auto copy_keys = [&](int64_t key_tile) {
    copy_keys_async<HD>(k[key_tile], v[key_tile], batch, key_col, key_tile * kRows, shape);
  };

  copy_rows_async<HD>(q, batch + shape.query_column(h, HD), shape.row_width, q0, shape.T);
  copy_keys(0);
  commit_copies();
  float o[HD / 8][4] = {};
  float running_max[2] = {-INFINITY, -INFINITY};  // log2 units
  float running_sum[2] = {0.0f, 0.0f};            // this thread's columns only, until the end

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kRows;
    begin_step(key_tile, query_tile + 1, stages, copy_keys);

    float s[kRows / 8][4];
    product_with_transpose<HD>(s, q, warp_row, k[key_tile], 0);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = rows[e / 2], j = k0 + n * 8 + 2 * t + (e & 1);
        s[n][e] = (i < shape.T && j <= i) ? s[n][e] * shape.scale_log2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float new_max = fmaxf(running_max[r], quad_max(tile_max[r]));
      alpha[r] = new_max == -INFINITY ? 1.0f : exp2f(running_max[r] - new_max);  // 0 at first
      running_max[r] = new_max;
      running_sum[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float p = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - running_max[r]);
        running_sum[r] += p;
        if (p != 0.0f) p *= shape.multiplier(pair, rows[r], k0 + n * 8 + 2 * t + (e & 1));
        s[n][e] = p;
      }
    }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    accumulate_product<HD, kRows / 16>(o, s, v[key_tile], 0);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    running_sum[r] = quad_sum(running_sum[r]);
    if (rows[r] >= shape.T) continue;
    store_row<HD>(output + (b * shape.T + rows[r]) * shape.hidden + h * HD, o, r,
                  1.0f / running_sum[r]);
    if (t == 0) {
      logsumexp[pair * shape.T + rows[r]] = (running_max[r] + log2f(running_sum[r])) * kLn2;
    }
  }
}

// ---- backward -----------------------------------------------------------------------------

template <int HD, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(E* dqkv, const E* doutput, const E* qkv, const E* output,
                    const float* logsumexp, FlashShape shape, int stages) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedCarve carve{shared_bytes};
  const auto [q, dout, k, v, row_logsumexp_log2, row_delta] = carve_dq<HD, E>(carve, stages);

  const auto [pair, b, h, query_tile, q0, batch, key_col] = query_tile_unit<HD>(qkv, shape);
  const int warp_row = (threadIdx.x / 32) * 16;
  const int t = lane_in_group();
  const int local_rows[2] = {warp_row + lane_group(), warp_row + lane_group() + 8};
  const auto copy_keys = [&](int64_t key_tile) {
    copy_keys_async<HD>(k[key_tile], v[key_tile], batch, key_col, key_tile * kRows, shape);
  };

  copy_queries_async<HD>(q, dout, batch, doutput, b, h, q0, shape);
  commit_copies();
  copy_keys(0);
  commit_copies();
  wait_copies<1>();  // Q and dO (the first key tile may still be in flight)
  __syncthreads();
  load_row_statistics<HD>(row_logsumexp_log2, row_delta, dout, output, logsumexp, b, h, q0,
                          shape);
  float dq[HD / 8][4] = {};

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kRows;
    // Its barrier also orders the row statistics' writes before the first reads.
    begin_step(key_tile, query_tile + 1, stages, copy_keys);

    float s[kRows / 8][4], dp[kRows / 8][4];
    product_with_transpose<HD>(s, q, warp_row, k[key_tile], 0);
    product_with_transpose<HD>(dp, dout, warp_row, v[key_tile], 0);
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int local = local_rows[e / 2];
        const int64_t i = q0 + local, j = k0 + n * 8 + 2 * t + (e & 1);
        float dscore = 0.0f;
        if (i < shape.T && j <= i) {
          const float p = exp2f(s[n][e] * shape.scale_log2 - row_logsumexp_log2[local]);
          dscore = p * (dp[n][e] * shape.multiplier(pair, i, j) - row_delta[local]);
        }
        s[n][e] = dscore;
      }
    }
    accumulate_product<HD, kRows / 16>(dq, s, k[key_tile], 0);
  }

  const int64_t query_col = shape.query_column(h, HD);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = q0 + local_rows[r];
    if (i >= shape.T) continue;
    store_row<HD>(dqkv + (b * shape.T + i) * shape.row_width + query_col, dq, r, shape.scale);
  }
}

template <int HD, typename E>
__global__ void __launch_bounds__(kThreads)
    flash_dkdv_kernel(E* dqkv, const E* doutput, const E* qkv, const E* output,
                      const float* logsumexp, int64_t num_groups, FlashShape shape, int stages) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  SharedCarve carve{shared_bytes};
  const auto [k, v, q, dout, row_logsumexp_log2, row_delta] = carve_dkdv<HD, E>(carve, stages);

  const int64_t b = blockIdx.y / num_groups, group = blockIdx.y % num_groups;
  const int64_t tiles = (shape.T + kRows - 1) / kRows;
  const int64_t key_tile = blockIdx.x;
  const int64_t k0 = key_tile * kRows;
  const E* batch = qkv + b * shape.T * shape.row_width;
  const int64_t key_col = shape.key_column(group, HD);
  const int warp_row = (threadIdx.x / 32) * 16;  // the warp's 16 keys
  const int t = lane_in_group();
  const int64_t keys[2] = {k0 + warp_row + lane_group(), k0 + warp_row + lane_group() + 8};
  // The steps: each of the group's heads with each query tile at or below the diagonal.
  const int64_t query_tiles = tiles - key_tile;
  const int64_t steps = shape.heads_per_group * query_tiles;
  const auto head_of = [&](int64_t step) {
    return group * shape.heads_per_group + step / query_tiles;
  };
  const auto first_query_of = [&](int64_t step) { return (key_tile + step % query_tiles) * kRows; };
  const auto copy_queries = [&](int64_t step) {
    copy_queries_async<HD>(q[step], dout[step], batch, doutput, b, head_of(step),
                           first_query_of(step), shape);
  };

  copy_keys_async<HD>(k, v, batch, key_col, k0, shape);
  copy_queries(0);
  commit_copies();
  float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};

  for (int64_t step = 0; step < steps; ++step) {
    const int64_t h = head_of(step), pair = b * shape.NH + h;
    const int64_t q0 = first_query_of(step);
    begin_step(step, steps, stages, copy_queries);  // also: the last step's statistics are read
    const E* q_tile = q[step];
    const E* dout_tile = dout[step];
    load_row_statistics<HD>(row_logsumexp_log2, row_delta, dout_tile, output, logsumexp, b, h, q0,
                            shape);
    __syncthreads();
    for (int chunk = 0; chunk < kRows / 16; ++chunk) {  // 16 queries: one k-step of dK, dV
      float st[2][4], dpt[2][4];  // S^T and dP^T: the warp's 16 keys × 16 queries
      product_with_transpose<HD>(st, k, warp_row, q_tile, chunk * 16);
      product_with_transpose<HD>(dpt, v, warp_row, dout_tile, chunk * 16);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int local = chunk * 16 + n * 8 + 2 * t + (e & 1);  // the query's tile row
          const int64_t i = q0 + local, j = keys[e / 2];
          float weight = 0.0f, dscore = 0.0f;
          if (i < shape.T && j <= i) {
            const float p = exp2f(st[n][e] * shape.scale_log2 - row_logsumexp_log2[local]);
            const float mask = shape.multiplier(pair, i, j);
            weight = p * mask;
            dscore = p * (dpt[n][e] * mask - row_delta[local]);
          }
          st[n][e] = weight;
          dpt[n][e] = dscore;
        }
      }
      accumulate_product<HD, 1>(dv, st, dout_tile, chunk * 16);
      accumulate_product<HD, 1>(dk, dpt, q_tile, chunk * 16);
    }
  }

  E* batch_dqkv = dqkv + b * shape.T * shape.row_width;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= shape.T) continue;
    E* key_row = batch_dqkv + keys[r] * shape.row_width + key_col;
    store_row<HD>(key_row, dk, r, shape.scale);
    store_row<HD>(key_row + HD, dv, r, 1.0f);
  }
}

// ---- host side ----------------------------------------------------------------------------

FlashShape make_flash_shape(const char* op, const AttentionShape& shape, const Dropout& dropout) {
  check_attention_shape(shape, op);
  if (!flash_attention_supports(shape.head_dim())) {
    common::fail(
        "{}: the tensor-core kernel takes head dimensions 64 and 128 (got {}); "
        "attention_forward/attention_backward take the others",
        op, shape.head_dim());
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim()));
  return {.T = shape.seq_length,
          .NH = shape.num_heads,
          .heads_per_group = shape.heads_per_group(),
          .row_width = shape.qkv_row_width(),
          .hidden = shape.hidden_size,
          .scale = static_cast<float>(scale),
          .scale_log2 = static_cast<float>(scale * 1.4426950408889634),
          .drop = dropout.active(),
          .key = dropout.key,
          .threshold = dropout.threshold(),
          .stored_key = dropout.stored_key,
          .dropout_scale = dropout.scale<float>()};
}

// The 16-byte copies (cp.async) need 16-byte aligned rows: the arenas' views are; a pointer
// that is not (an offset view) is refused rather than read misaligned.
void check_aligned(const char* op, const void* pointer, const char* name) {
  if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
    common::fail("{}: {} at {} is not 16-byte aligned, which the tensor-core kernel's loads "
                 "need; attention_forward/attention_backward take any alignment",
                 op, name, pointer);
  }
}

template <typename Kernel>
void prepare(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
}

// Two stages where this GPU's shared memory per block holds them (sm_80's 163 KiB and sm_90's
// 227 KiB always; sm_86's and sm_89's 99 KiB not the backward's at head dimension 128), else one.
struct Staging {
  int stages;
  size_t bytes;
};
template <typename Carve>
Staging choose_stages(const char* op, Carve carve) {
  int device = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  for (const int stages : {2, 1}) {
    const size_t bytes = shared_bytes_of(carve, stages);
    if (bytes <= static_cast<size_t>(limit)) return {stages, bytes};
  }
  common::fail(
      "{}: the tensor-core kernel needs {} bytes of shared memory per block and this GPU "
      "gives {}; --attention-backend local runs the CUDA-core kernel",
      op, shared_bytes_of(carve, 1), limit);
}

dim3 flash_grid(const char* op, int64_t tiles, int64_t units) {
  if (units > 65535) common::fail("{}: {} (batch × heads) units exceed the grid", op, units);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(units));
}

template <int HD, typename E>
void launch_forward(E* output, float* logsumexp, const E* qkv, int64_t batch_size,
                    const FlashShape& shape, CudaStream stream) {
  constexpr const char* op = "flash_attention_forward";
  const Staging staging = choose_stages(op, carve_forward<HD, E>);
  prepare(flash_forward_kernel<HD, E>, staging.bytes);
  const int64_t tiles = (shape.T + kRows - 1) / kRows;
  flash_forward_kernel<HD, E>
      <<<flash_grid(op, tiles, batch_size * shape.NH), kThreads, staging.bytes, stream>>>(
          output, logsumexp, qkv, shape, staging.stages);
  CUDA_CHECK(cudaGetLastError());
}

template <int HD, typename E>
void launch_backward(E* dqkv, const E* doutput, const E* qkv, const E* output,
                     const float* logsumexp, int64_t batch_size, int64_t num_groups,
                     const FlashShape& shape, CudaStream stream) {
  const int64_t tiles = (shape.T + kRows - 1) / kRows;
  // The two kernels write disjoint columns of dqkv (keys and values; queries), which together
  // are all of it: dqkv is overwritten.
  constexpr const char* op = "flash_attention_backward";
  const Staging dkdv = choose_stages(op, carve_dkdv<HD, E>);
  prepare(flash_dkdv_kernel<HD, E>, dkdv.bytes);
  flash_dkdv_kernel<HD, E>
      <<<flash_grid(op, tiles, batch_size * num_groups), kThreads, dkdv.bytes, stream>>>(
          dqkv, doutput, qkv, output, logsumexp, num_groups, shape, dkdv.stages);
  CUDA_CHECK(cudaGetLastError());
  const Staging dq = choose_stages(op, carve_dq<HD, E>);
  prepare(flash_dq_kernel<HD, E>, dq.bytes);
  flash_dq_kernel<HD, E>
      <<<flash_grid(op, tiles, batch_size * shape.NH), kThreads, dq.bytes, stream>>>(
          dqkv, doutput, qkv, output, logsumexp, shape, dq.stages);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// The public entry points, for the host element type Scalar (bfloat16, float16) and its device
// type E.
template <typename Scalar>
void flash_attention_forward(Scalar* output, float* logsumexp, const Scalar* qkv,
                             const AttentionShape& geometry, const Dropout& dropout,
                             CudaStream stream) {
  using E = DeviceElement<Scalar>;
  constexpr const char* op = "flash_attention_forward";
  const FlashShape shape = make_flash_shape(op, geometry, dropout);
  check_aligned(op, qkv, "qkv");
  check_aligned(op, output, "output");
  if (geometry.empty()) return;
  auto* o = reinterpret_cast<E*>(output);
  const auto* x = reinterpret_cast<const E*>(qkv);
  if (geometry.head_dim() == 64) {
    launch_forward<64>(o, logsumexp, x, geometry.batch_size, shape, stream);
  } else {
    launch_forward<128>(o, logsumexp, x, geometry.batch_size, shape, stream);
  }
}

template <typename Scalar>
void flash_attention_backward(Scalar* dqkv, const Scalar* doutput, const Scalar* qkv,
                              const Scalar* output, const float* logsumexp,
                              const AttentionShape& geometry, const Dropout& dropout,
                              CudaStream stream) {
  using E = DeviceElement<Scalar>;
  constexpr const char* op = "flash_attention_backward";
  const FlashShape shape = make_flash_shape(op, geometry, dropout);
  check_aligned(op, dqkv, "dqkv");
  check_aligned(op, doutput, "doutput");
  check_aligned(op, qkv, "qkv");
  if (geometry.empty()) return;
  auto* d = reinterpret_cast<E*>(dqkv);
  const auto* dout = reinterpret_cast<const E*>(doutput);
  const auto* x = reinterpret_cast<const E*>(qkv);
  const auto* o = reinterpret_cast<const E*>(output);
  const int64_t batch_size = geometry.batch_size, groups = geometry.num_query_groups;
  if (geometry.head_dim() == 64) {
    launch_backward<64>(d, dout, x, o, logsumexp, batch_size, groups, shape, stream);
  } else {
    launch_backward<128>(d, dout, x, o, logsumexp, batch_size, groups, shape, stream);
  }
}

#define BACKEND_INSTANTIATE_FLASH_ATTENTION_CUDA(Scalar)                                         \
  template void flash_attention_forward<Scalar>(                                                 \
      Scalar*, float*, const Scalar*, const AttentionShape&, const Dropout&, CudaStream);        \
  template void flash_attention_backward<Scalar>(                                                \
      Scalar*, const Scalar*, const Scalar*, const Scalar*, const float*, const AttentionShape&, \
      const Dropout&, CudaStream);
BACKEND_INSTANTIATE_FLASH_ATTENTION_CUDA(bfloat16)
BACKEND_INSTANTIATE_FLASH_ATTENTION_CUDA(float16)
#undef BACKEND_INSTANTIATE_FLASH_ATTENTION_CUDA

}  // namespace backend::cuda
