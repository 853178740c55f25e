// CUDA twin of attention.hpp: causal GQA attention in FlashAttention-2's blockwise form (Dao
// 2023, Algorithms 1 and 2), written for clarity on CUDA cores in fp32 (bf16 qkv is converted
// on load and rounded on store). Tiles of kTile query rows × kTile keys live in shared memory;
// no (T, T) array exists anywhere. The math, the qkv layout and the dropout mask elements
// ((b·NH + h)·T + i)·T + j are attention.hpp's, so the results are the CPU twin's to rounding.
//
// Kernels (one thread block each, kThreads threads):
//   forward   per (b, h, query tile): over the key tiles at or below the diagonal, S = Q·K^T·s,
//             the online softmax (running max m and sum l, O rescaled by exp(m_old − m_new)),
//             O += dropout(P)·V; at the end O /= l and L = m + log l.
//   dK, dV    per (b, group, key tile): over the group's heads and, for each, the query tiles
//             at or below the diagonal: P = exp(S − L), D = P·mask, dV += D^T·dO,
//             dS = P ∘ (mask·(dO·V^T) − Δ) with Δ = rowsum(dO ∘ O), dK += s·dS^T·Q.
//   dQ        per (b, h, query tile): over the key tiles, dQ += s·dS·K.
// Each output element is owned by one thread, which sums in loop order, and row sums are warp
// shuffles in a fixed butterfly: the results are the same bits run after run (no atomics, no
// scratch). kv_cache_attention_forward (incremental decoding) is two simpler kernels at the end:
// a store of the rows' keys and values, then one warp per (row, head) over the slot's cache.
// The backward recomputes S twice (once per kernel), the price of owning dQ and
// dK/dV without atomics or a (T, HD) partial per key tile.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/common/error.hpp"
#include "backend/core/cuda_check.cuh"
#include "backend/ops/attention.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

constexpr int kTile = 32;  // query rows and keys per tile: one warp lane per key of a row
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kScoreStride = kTile + 1;  // padded: column reads hit distinct banks

template <typename T>
__device__ inline float load(T value) {
  return detail::to_float(value);
}
template <typename T>
__device__ inline T store(float value) {
  return detail::from_float<T>(value);
}

// Warp reductions: detail::warp_max and detail::warp_sum, the same butterfly every time.
using detail::warp_max;
using detail::warp_sum;

struct Shape {
  int64_t T, HD, NH, heads_per_group, row_width, hidden;
  float scale;  // 1/sqrt(HD)
  bool drop;
  uint64_t key, threshold;
  const uint64_t* stored_key;  // Dropout::stored_key: the key read from device memory
  float dropout_scale;

  __device__ int64_t group_column(int64_t group) const {
    return group * (heads_per_group + 2) * HD;
  }
  __device__ int64_t query_column(int64_t h) const {
    return group_column(h / heads_per_group) + (h % heads_per_group) * HD;
  }
  __device__ int64_t key_column(int64_t group) const {
    return group_column(group) + heads_per_group * HD;
  }
  // keep ? 1/(1 − p) : 0 for element (pair, i, j) of the mask; 1 without dropout.
  __device__ float multiplier(int64_t pair, int64_t i, int64_t j) const {
    if (!drop) return 1.0f;
    const auto index = static_cast<uint64_t>((pair * T + i) * T + j);
    const uint64_t mask_key = stored_key != nullptr ? *stored_key : key;
    return dropout_keep(mask_key, index, threshold) ? dropout_scale : 0.0f;
  }
};

// tile[r·(HD+1) + d] = source[(row0 + r)·stride + d] for rows < T, 0 beyond.
template <typename T>
__device__ void load_tile(float* tile, const T* source, int64_t stride, int64_t row0,
                          const Shape& shape) {
  const int64_t pitch = shape.HD + 1;
  for (int64_t e = threadIdx.x; e < kTile * shape.HD; e += kThreads) {
    const int64_t r = e / shape.HD, d = e % shape.HD;
    const int64_t row = row0 + r;
    tile[r * pitch + d] = row < shape.T ? load(source[row * stride + d]) : 0.0f;
  }
}

// destination[(row0 + r)·stride + d] = value(r, tile[r·(HD+1) + d]) for rows < T: load_tile's
// way back, each element written by the thread that loaded its place.
template <typename T, typename Value>
__device__ void store_tile(T* destination, int64_t stride, int64_t row0, const float* tile,
                           const Shape& shape, Value value) {
  const int64_t pitch = shape.HD + 1;
  for (int64_t e = threadIdx.x; e < kTile * shape.HD; e += kThreads) {
    const int64_t r = e / shape.HD, d = e % shape.HD;
    const int64_t row = row0 + r;
    if (row < shape.T) destination[row * stride + d] = store<T>(value(r, tile[r * pitch + d]));
  }
}
__device__ inline float as_is(int64_t, float value) {
  return value;
}

// The key and value tile of keys k0.. of the group whose key column is `key_column`.
template <typename T>
__device__ void load_keys_and_values(float* k, float* v, const T* batch, int64_t key_column,
                                     int64_t k0, const Shape& shape) {
  load_tile(k, batch + key_column, shape.row_width, k0, shape);
  load_tile(v, batch + key_column + shape.HD, shape.row_width, k0, shape);
}

// The query tile of rows q0.. of head h and its output gradient's.
template <typename T>
__device__ void load_queries_and_gradients(float* q, float* dout, const T* batch, const T* doutput,
                                           int64_t b, int64_t h, int64_t q0, const Shape& shape) {
  load_tile(q, batch + shape.query_column(h), shape.row_width, q0, shape);
  load_tile(dout, doutput + b * shape.T * shape.hidden + h * shape.HD, shape.hidden, q0, shape);
}

__device__ float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// ---- forward ------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(T* output, float* logsumexp, const T* qkv, Shape shape) {
  extern __shared__ float shared[];
  const int64_t pitch = shape.HD + 1;
  float* q = shared;
  float* k = q + kTile * pitch;
  float* v = k + kTile * pitch;
  float* o = v + kTile * pitch;
  float* s = o + kTile * pitch;  // scores, then weights
  float* row_max = s + kTile * kScoreStride;
  float* row_sum = row_max + kTile;
  float* rescale = row_sum + kTile;

  const int64_t pair = blockIdx.y;  // b·NH + h
  const int64_t b = pair / shape.NH, h = pair % shape.NH;
  const int64_t tiles = (shape.T + kTile - 1) / kTile;
  const int64_t query_tile = tiles - 1 - blockIdx.x;  // longest first
  const int64_t q0 = query_tile * kTile;
  const T* batch = qkv + b * shape.T * shape.row_width;
  const int64_t key_col = shape.key_column(h / shape.heads_per_group);

  load_tile(q, batch + shape.query_column(h), shape.row_width, q0, shape);
  for (int64_t e = threadIdx.x; e < kTile * pitch; e += kThreads) o[e] = 0.0f;
  if (threadIdx.x < kTile) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kTile;
    __syncthreads();  // the previous tile's k, v, s are read
    load_keys_and_values(k, v, batch, key_col, k0, shape);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      const int64_t i = q0 + r, j = k0 + c;
      s[r * kScoreStride + c] = (i < shape.T && j <= i)
                                    ? dot(q + r * pitch, k + c * pitch, shape.HD) * shape.scale
                                    : -INFINITY;
    }
    __syncthreads();
    for (int r = warp; r < kTile; r += kWarps) {  // lane = key column
      const int64_t i = q0 + r, j = k0 + lane;
      const float score = s[r * kScoreStride + lane];
      const float old_max = row_max[r];
      const float new_max = fmaxf(old_max, warp_max(score));
      float p = 0.0f, alpha = 1.0f;
      if (new_max != -INFINITY) {  // rows past T see nothing
        p = score == -INFINITY ? 0.0f : expf(score - new_max);
        alpha = expf(old_max - new_max);  // 0 on the first tile
      }
      const float sum = warp_sum(p);
      if (p != 0.0f) p *= shape.multiplier(pair, i, j);
      s[r * kScoreStride + lane] = p;
      __syncwarp();
      if (lane == 0) {
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = new_max;
        rescale[r] = alpha;
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTile * shape.HD; e += kThreads) {
      const int64_t r = e / shape.HD, d = e % shape.HD;
      float accumulated = o[r * pitch + d] * rescale[r];
      for (int c = 0; c < kTile; ++c) accumulated += s[r * kScoreStride + c] * v[c * pitch + d];
      o[r * pitch + d] = accumulated;
    }
  }
  __syncthreads();
  store_tile(output + b * shape.T * shape.hidden + h * shape.HD, shape.hidden, q0, o, shape,
             [&](int64_t r, float value) { return value / row_sum[r]; });
  if (threadIdx.x < kTile && q0 + threadIdx.x < shape.T) {
    logsumexp[pair * shape.T + q0 + threadIdx.x] =
        row_max[threadIdx.x] + logf(row_sum[threadIdx.x]);
  }
}

// ---- backward -----------------------------------------------------------------------------

// The backward kernels' shared memory: the query rows' q and dO tiles, the keys' k and v tiles,
// `sum_tiles` tiles the kernel accumulates into (dK and dV, or dQ), the score tiles D and dS,
// and the rows' L and Δ (prepare_shared_memory's count).
struct BackwardTiles {
  float *q, *dout, *k, *v, *sums, *weights, *dscores, *row_logsumexp, *row_delta;
};
__device__ BackwardTiles carve_backward_tiles(float* shared, int64_t pitch, int sum_tiles) {
  BackwardTiles tiles;
  tiles.q = shared;
  tiles.dout = tiles.q + kTile * pitch;
  tiles.k = tiles.dout + kTile * pitch;
  tiles.v = tiles.k + kTile * pitch;
  tiles.sums = tiles.v + kTile * pitch;
  tiles.weights = tiles.sums + sum_tiles * kTile * pitch;
  tiles.dscores = tiles.weights + kTile * kScoreStride;
  tiles.row_logsumexp = tiles.dscores + kTile * kScoreStride;
  tiles.row_delta = tiles.row_logsumexp + kTile;
  return tiles;
}

// For one (query tile, key tile) of head pair `pair`, with the q, dout, k, v tiles and the rows'
// L and Δ in shared memory: weights = P·mask (D), dscores = P ∘ (mask·(dO·V^T) − Δ) (dS).
__device__ void backward_scores(const BackwardTiles& tiles, int64_t pair, int64_t q0, int64_t k0,
                                const Shape& shape) {
  const float *q = tiles.q, *dout = tiles.dout, *k = tiles.k, *v = tiles.v;
  const float *row_logsumexp = tiles.row_logsumexp, *row_delta = tiles.row_delta;
  float *weights = tiles.weights, *dscores = tiles.dscores;
  const int64_t pitch = shape.HD + 1;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    const int64_t i = q0 + r, j = k0 + c;
    float weight = 0.0f, dscore = 0.0f;
    if (i < shape.T && j <= i) {
      const float p =
          expf(dot(q + r * pitch, k + c * pitch, shape.HD) * shape.scale - row_logsumexp[r]);
      const float mask = shape.multiplier(pair, i, j);
      weight = p * mask;
      dscore = p * (dot(dout + r * pitch, v + c * pitch, shape.HD) * mask - row_delta[r]);
    }
    weights[r * kScoreStride + c] = weight;
    dscores[r * kScoreStride + c] = dscore;
  }
}

// L and Δ = Σ_d dO·O of the query tile's rows (dO in shared memory, O from global memory).
template <typename T>
__device__ void load_row_statistics(const BackwardTiles& tiles, const T* output,
                                    const float* logsumexp, int64_t b, int64_t h, int64_t q0,
                                    const Shape& shape) {
  const float* dout = tiles.dout;
  float *row_logsumexp = tiles.row_logsumexp, *row_delta = tiles.row_delta;
  const int64_t pitch = shape.HD + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kTile; r += kWarps) {
    const int64_t i = q0 + r;
    float partial = 0.0f;
    if (i < shape.T) {
      const T* o = output + (b * shape.T + i) * shape.hidden + h * shape.HD;
      for (int64_t d = lane; d < shape.HD; d += 32) partial += dout[r * pitch + d] * load(o[d]);
    }
    const float delta = warp_sum(partial);
    if (lane == 0) {
      row_delta[r] = delta;
      row_logsumexp[r] = i < shape.T ? logsumexp[(b * shape.NH + h) * shape.T + i] : 0.0f;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(T* dqkv, const T* doutput, const T* qkv, const T* output,
                const float* logsumexp, int64_t num_groups, Shape shape) {
  extern __shared__ float shared[];
  const int64_t pitch = shape.HD + 1;
  const BackwardTiles tiles = carve_backward_tiles(shared, pitch, 2);
  const float *q = tiles.q, *dout = tiles.dout, *weights = tiles.weights;
  const float* dscores = tiles.dscores;
  float* dk = tiles.sums;
  float* dv = dk + kTile * pitch;

  const int64_t b = blockIdx.y / num_groups, group = blockIdx.y % num_groups;
  const int64_t query_tiles = (shape.T + kTile - 1) / kTile;
  const int64_t key_tile = blockIdx.x;
  const int64_t k0 = key_tile * kTile;
  const T* batch = qkv + b * shape.T * shape.row_width;
  const int64_t key_col = shape.key_column(group);

  load_keys_and_values(tiles.k, tiles.v, batch, key_col, k0, shape);
  for (int64_t e = threadIdx.x; e < kTile * pitch; e += kThreads) {
    dk[e] = 0.0f;
    dv[e] = 0.0f;
  }
  for (int64_t head = 0; head < shape.heads_per_group; ++head) {
    const int64_t h = group * shape.heads_per_group + head;
    const int64_t pair = b * shape.NH + h;
    for (int64_t query_tile = key_tile; query_tile < query_tiles; ++query_tile) {
      const int64_t q0 = query_tile * kTile;
      __syncthreads();  // the previous step's q, dout, weights, dscores are read
      load_queries_and_gradients(tiles.q, tiles.dout, batch, doutput, b, h, q0, shape);
      __syncthreads();
      load_row_statistics(tiles, output, logsumexp, b, h, q0, shape);
      __syncthreads();
      backward_scores(tiles, pair, q0, k0, shape);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < kTile * shape.HD; e += kThreads) {
        const int64_t c = e / shape.HD, d = e % shape.HD;
        float dv_sum = 0.0f, dk_sum = 0.0f;
        for (int r = 0; r < kTile; ++r) {
          dv_sum += weights[r * kScoreStride + c] * dout[r * pitch + d];
          dk_sum += dscores[r * kScoreStride + c] * q[r * pitch + d];
        }
        dv[c * pitch + d] += dv_sum;
        dk[c * pitch + d] += dk_sum * shape.scale;
      }
    }
  }
  __syncthreads();
  T* batch_dqkv = dqkv + b * shape.T * shape.row_width;
  store_tile(batch_dqkv + key_col, shape.row_width, k0, dk, shape, as_is);
  store_tile(batch_dqkv + key_col + shape.HD, shape.row_width, k0, dv, shape, as_is);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(T* dqkv, const T* doutput, const T* qkv, const T* output, const float* logsumexp,
              Shape shape) {
  extern __shared__ float shared[];
  const int64_t pitch = shape.HD + 1;
  const BackwardTiles tiles = carve_backward_tiles(shared, pitch, 1);
  const float *k = tiles.k, *dscores = tiles.dscores;
  float* dq = tiles.sums;

  const int64_t pair = blockIdx.y;
  const int64_t b = pair / shape.NH, h = pair % shape.NH;
  const int64_t query_tiles = (shape.T + kTile - 1) / kTile;
  const int64_t query_tile = query_tiles - 1 - blockIdx.x;  // longest first
  const int64_t q0 = query_tile * kTile;
  const T* batch = qkv + b * shape.T * shape.row_width;
  const int64_t key_col = shape.key_column(h / shape.heads_per_group);

  load_queries_and_gradients(tiles.q, tiles.dout, batch, doutput, b, h, q0, shape);
  for (int64_t e = threadIdx.x; e < kTile * pitch; e += kThreads) dq[e] = 0.0f;
  __syncthreads();
  load_row_statistics(tiles, output, logsumexp, b, h, q0, shape);
  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kTile;
    __syncthreads();  // the previous tile's k, dscores are read
    load_keys_and_values(tiles.k, tiles.v, batch, key_col, k0, shape);
    __syncthreads();
    backward_scores(tiles, pair, q0, k0, shape);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTile * shape.HD; e += kThreads) {
      const int64_t r = e / shape.HD, d = e % shape.HD;
      float sum = 0.0f;
      for (int c = 0; c < kTile; ++c) sum += dscores[r * kScoreStride + c] * k[c * pitch + d];
      dq[r * pitch + d] += sum * shape.scale;
    }
  }
  __syncthreads();
  store_tile(dqkv + b * shape.T * shape.row_width + shape.query_column(h), shape.row_width, q0, dq,
             shape, as_is);
}

// ---- host side ----------------------------------------------------------------------------

template <typename Scalar>
using DeviceType = detail::DeviceElementOf<Scalar>;

Shape make_shape(const char* op, const AttentionShape& shape, const Dropout& dropout) {
  check_attention_shape(shape, op);
  const int64_t head_dim = shape.head_dim();
  if (head_dim > kAttentionMaxHeadDim) {
    common::fail("{}: head dimension {} is above the CUDA kernel's {}", op, head_dim,
                 kAttentionMaxHeadDim);
  }
  return {.T = shape.seq_length,
          .HD = head_dim,
          .NH = shape.num_heads,
          .heads_per_group = shape.heads_per_group(),
          .row_width = shape.qkv_row_width(),
          .hidden = shape.hidden_size,
          .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))),
          .drop = dropout.active(),
          .key = dropout.key,
          .threshold = dropout.threshold(),
          .stored_key = dropout.stored_key,
          .dropout_scale = dropout.scale<float>()};
}

// Dynamic shared memory of `tiles` (kTile × (HD+1)) float tiles, `scores` score tiles and 3
// per-row vectors; above 48 KiB the kernel must opt in.
template <typename Kernel>
size_t prepare_shared_memory(Kernel kernel, const Shape& shape, int tiles, int scores) {
  const size_t bytes =
      sizeof(float) * (static_cast<size_t>(tiles) * kTile * static_cast<size_t>(shape.HD + 1) +
                       static_cast<size_t>(scores) * kTile * kScoreStride + 3 * kTile);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
  return bytes;
}

dim3 grid_of(const char* op, int64_t tiles, int64_t units) {
  if (units > 65535) common::fail("{}: {} (batch × heads) units exceed the grid", op, units);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(units));
}


// ---- attention over a key/value cache (attention.hpp's kv_cache_attention_forward)

// One thread per (row, group, feature): the row's key and value into the slot's place.
template <typename T>
__global__ void kv_cache_store_kernel(T* key_cache, T* value_cache, const T* qkv,
                                      const int32_t* slots, const int32_t* positions,
                                      int64_t rows, int64_t heads_per_group,
                                      int64_t num_query_groups, int64_t head_dim,
                                      int64_t max_length) {
  const int64_t count = rows * num_query_groups * head_dim;
  const int64_t group_width = (heads_per_group + 2) * head_dim;
  for (const int64_t i : detail::grid_stride(count)) {
    const int64_t d = i % head_dim;
    const int64_t g = (i / head_dim) % num_query_groups;
    const int64_t r = i / (head_dim * num_query_groups);
    const T* key = qkv + r * num_query_groups * group_width + g * group_width +
                   heads_per_group * head_dim;
    const int64_t place =
        ((int64_t{slots[r]} * max_length + int64_t{positions[r]}) * num_query_groups + g) *
            head_dim + d;
    key_cache[place] = key[d];
    value_cache[place] = key[head_dim + d];
  }
}

constexpr int kCacheFeaturesPerLane = kAttentionMaxHeadDim / 32;

// One warp per (row, head): lane l holds features l, l + 32, … of the query and the output; per
// cached position in order, the score is the warp's butterfly sum, and the online softmax
// rescales the running output when the maximum grows.
template <typename T>
__global__ void kv_cache_attend_kernel(T* output, const T* key_cache, const T* value_cache,
                                       const T* qkv, const int32_t* slots,
                                       const int32_t* positions, int64_t num_heads,
                                       int64_t heads_per_group, int64_t num_query_groups,
                                       int64_t head_dim, int64_t max_length, float scale) {
  const int64_t unit = blockIdx.x;
  const int64_t r = unit / num_heads;
  const int64_t h = unit % num_heads;
  const int64_t g = h / heads_per_group;
  const int lane = static_cast<int>(threadIdx.x);
  const int64_t group_width = (heads_per_group + 2) * head_dim;
  const T* query =
      qkv + r * num_query_groups * group_width + g * group_width + (h % heads_per_group) * head_dim;
  const int64_t position_stride = num_query_groups * head_dim;
  const int64_t slot_start = int64_t{slots[r]} * max_length * position_stride + g * head_dim;
  float q[kCacheFeaturesPerLane];
  float accumulator[kCacheFeaturesPerLane];
#pragma unroll
  for (int k = 0; k < kCacheFeaturesPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    q[k] = d < head_dim ? load(query[d]) : 0.0f;
    accumulator[k] = 0.0f;
  }
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  const int64_t length = int64_t{positions[r]} + 1;
  for (int64_t j = 0; j < length; ++j) {
    const T* key = key_cache + slot_start + j * position_stride;
    const T* value = value_cache + slot_start + j * position_stride;
    float partial = 0.0f;
#pragma unroll
    for (int k = 0; k < kCacheFeaturesPerLane; ++k) {
      const int64_t d = lane + 32 * k;
      if (d < head_dim) partial += q[k] * load(key[d]);
    }
    const float score = warp_sum(partial) * scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (int k = 0; k < kCacheFeaturesPerLane; ++k) {
      const int64_t d = lane + 32 * k;
      if (d < head_dim) accumulator[k] = accumulator[k] * correction + weight * load(value[d]);
    }
    running_max = new_max;
  }
  T* out = output + r * num_heads * head_dim + h * head_dim;
#pragma unroll
  for (int k = 0; k < kCacheFeaturesPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < head_dim) out[d] = store<T>(accumulator[k] / running_sum);
  }
}

}  // namespace

template <typename Scalar>
void attention_forward(Scalar* output, float* logsumexp, const Scalar* qkv,
                       const AttentionShape& geometry, const Dropout& dropout, CudaStream stream) {
  using T = DeviceType<Scalar>;
  const Shape shape = make_shape("attention_forward", geometry, dropout);
  if (geometry.empty()) return;
  const int64_t tiles = (shape.T + kTile - 1) / kTile;
  const size_t bytes = prepare_shared_memory(forward_kernel<T>, shape, 4, 1);
  forward_kernel<T>
      <<<grid_of("attention_forward", tiles, geometry.batch_size * shape.NH), kThreads, bytes,
         stream>>>(reinterpret_cast<T*>(output), logsumexp, reinterpret_cast<const T*>(qkv), shape);
  CUDA_CHECK(cudaGetLastError());
}

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* doutput, const Scalar* qkv,
                        const Scalar* output, const float* logsumexp,
                        const AttentionShape& geometry, const Dropout& dropout, CudaStream stream) {
  using T = DeviceType<Scalar>;
  const Shape shape = make_shape("attention_backward", geometry, dropout);
  if (geometry.empty()) return;
  const int64_t tiles = (shape.T + kTile - 1) / kTile;
  const int64_t groups = geometry.num_query_groups;
  auto* d = reinterpret_cast<T*>(dqkv);
  const auto* dout = reinterpret_cast<const T*>(doutput);
  const auto* x = reinterpret_cast<const T*>(qkv);
  const auto* o = reinterpret_cast<const T*>(output);
  // The two kernels write disjoint columns of dqkv (keys and values; queries), which together
  // are all of it: dqkv is overwritten.
  const size_t dkdv_bytes = prepare_shared_memory(dkdv_kernel<T>, shape, 6, 2);
  dkdv_kernel<T><<<grid_of("attention_backward", tiles, geometry.batch_size * groups), kThreads,
                   dkdv_bytes, stream>>>(d, dout, x, o, logsumexp, groups, shape);
  CUDA_CHECK(cudaGetLastError());
  const size_t dq_bytes = prepare_shared_memory(dq_kernel<T>, shape, 5, 2);
  dq_kernel<T><<<grid_of("attention_backward", tiles, geometry.batch_size * shape.NH), kThreads,
                 dq_bytes, stream>>>(d, dout, x, o, logsumexp, shape);
  CUDA_CHECK(cudaGetLastError());
}

#define BACKEND_INSTANTIATE_ATTENTION_CUDA(Scalar)                                               \
  template void attention_forward<Scalar>(Scalar*, float*, const Scalar*, const AttentionShape&, \
                                          const Dropout&, CudaStream);                           \
  template void attention_backward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*, \
                                           const float*, const AttentionShape&, const Dropout&,  \
                                           CudaStream);
BACKEND_INSTANTIATE_ATTENTION_CUDA(float)
BACKEND_INSTANTIATE_ATTENTION_CUDA(bfloat16)
BACKEND_INSTANTIATE_ATTENTION_CUDA(float16)
#undef BACKEND_INSTANTIATE_ATTENTION_CUDA

template <typename Scalar>
void kv_cache_attention_forward(Scalar* output, Scalar* key_cache, Scalar* value_cache,
                                const Scalar* qkv, const int32_t* slots,
                                const int32_t* positions, int64_t rows, int64_t num_heads,
                                int64_t num_query_groups, int64_t head_dim, int64_t max_length,
                                CudaStream stream) {
  using T = DeviceType<Scalar>;
  if (head_dim > kAttentionMaxHeadDim || head_dim <= 0 || num_query_groups <= 0 ||
      num_heads % num_query_groups != 0) {
    common::fail("kv_cache_attention_forward: head dimension {} (the CUDA twin takes 1..{}) with "
                 "{} heads in {} query groups (heads must be a multiple of the groups)",
                 head_dim, kAttentionMaxHeadDim, num_heads, num_query_groups);
  }
  if (rows <= 0) return;
  const int64_t heads_per_group = num_heads / num_query_groups;
  const int64_t count = rows * num_query_groups * head_dim;
  const int64_t store_blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 8192);
  kv_cache_store_kernel<T><<<static_cast<unsigned>(store_blocks), kThreads, 0, stream>>>(
      reinterpret_cast<T*>(key_cache), reinterpret_cast<T*>(value_cache),
      reinterpret_cast<const T*>(qkv), slots, positions, rows, heads_per_group, num_query_groups,
      head_dim, max_length);
  CUDA_CHECK(cudaGetLastError());
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  kv_cache_attend_kernel<T><<<static_cast<unsigned>(rows * num_heads), 32, 0, stream>>>(
      reinterpret_cast<T*>(output), reinterpret_cast<const T*>(key_cache),
      reinterpret_cast<const T*>(value_cache), reinterpret_cast<const T*>(qkv), slots, positions,
      num_heads, heads_per_group, num_query_groups, head_dim, max_length, scale);
  CUDA_CHECK(cudaGetLastError());
}

template void kv_cache_attention_forward<float>(float*, float*, float*, const float*,
                                                const int32_t*, const int32_t*, int64_t, int64_t,
                                                int64_t, int64_t, int64_t, CudaStream);
template void kv_cache_attention_forward<bfloat16>(bfloat16*, bfloat16*, bfloat16*,
                                                   const bfloat16*, const int32_t*,
                                                   const int32_t*, int64_t, int64_t, int64_t,
                                                   int64_t, int64_t, CudaStream);
template void kv_cache_attention_forward<float16>(float16*, float16*, float16*, const float16*,
                                                  const int32_t*, const int32_t*, int64_t,
                                                  int64_t, int64_t, int64_t, int64_t,
                                                  CudaStream);

}  // namespace backend::cuda
