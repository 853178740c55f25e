// CPU twin of attention.hpp. Every product is a single-threaded OpenBLAS GEMM on a strided
// view of the qkv activation and a (query rows × key rows) score block in per-thread scratch,
// so the working memory is O(blocks), not O(T²). The causal mask skips whole blocks above
// the diagonal (half the score work at long T); inside a block on the diagonal, the entries
// j > i are set to zero before the products, which is cheaper than splitting the GEMMs.
//
// Parallel units (OpenMP, each computed by one thread in a fixed order, so results do not
// depend on the thread count):
//   forward:  (b, h, query block), biggest (last, most key blocks) first for the balance;
//   backward: (b, query group): the group's dK, dV collect contributions from every query
//             block of every head in the group, and each dQ block from every key block, so
//             one thread owns all of them and sums in loop order (key block, head, query
//             block). B·NG units; at NG = 1 and B below the thread count some threads idle,
//             the price of deterministic sums without a (T, HD) partial per key block.
// Dropout multipliers (keep ? 1/(1 − p) : 0) of a block are drawn once into scratch and used
// for both D and dP in the backward; the stream index is the dense (B, NH, T, T) one, so the
// masks equal those of a whole-matrix implementation.
// The float path takes the softmax exponentials from vector_math_cpu.hpp (fast_exp, and
// lane_sum for the row sums): vectorised, where std::exp was a quarter to a third of the
// backward. The double path keeps std::exp and running sums.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "backend/common/error.hpp"
#include "backend/ops/attention.hpp"
#include "backend/ops/gemm_cpu.hpp"
#include "backend/ops/vector_math_cpu.hpp"

namespace backend::cpu {

using detail::Transpose;

namespace {

// Where things are in the qkv row (attention.hpp's layout).
struct QkvLayout {
  int64_t head_dim;
  int64_t heads_per_group;
  int64_t row_width;  // (NH + 2·NG)·HD

  int64_t group_column(int64_t group) const { return group * (heads_per_group + 2) * head_dim; }
  int64_t query_column(int64_t head) const {
    return group_column(head / heads_per_group) + (head % heads_per_group) * head_dim;
  }
  int64_t key_column(int64_t group) const {
    return group_column(group) + heads_per_group * head_dim;
  }
  int64_t value_column(int64_t group) const { return key_column(group) + head_dim; }
};

QkvLayout check_shape(const AttentionShape& shape, const AttentionBlocks& blocks, const char* op) {
  check_attention_shape(shape, op);
  if (blocks.query_rows <= 0 || blocks.key_rows <= 0) {
    common::fail("{}: block sizes must be positive, got {} query and {} key rows", op,
                 blocks.query_rows, blocks.key_rows);
  }
  return {.head_dim = shape.head_dim(),
          .heads_per_group = shape.heads_per_group(),
          .row_width = shape.qkv_row_width()};
}

// Number of keys of block [key_begin, key_begin + columns) that query row i may see (j ≤ i).
int64_t visible_keys(int64_t i, int64_t key_begin, int64_t columns) {
  return std::clamp<int64_t>(i + 1 - key_begin, 0, columns);
}

// multipliers[r, c] = keep ? scale : 0 for the mask elements of rows [query_begin, +rows) and
// key columns [key_begin, +columns) of one (b, h) pair; `first` indexes its element (0, 0).
template <typename Scalar>
void draw_dropout_block(Scalar* multipliers, int64_t stride, int64_t rows, int64_t columns,
                        int64_t query_begin, int64_t key_begin, int64_t seq_length, uint64_t first,
                        uint64_t key, uint64_t threshold, Scalar scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = query_begin + r;
    const uint64_t row_first = first + static_cast<uint64_t>(i * seq_length + key_begin);
    const int64_t visible = visible_keys(i, key_begin, columns);
    for (int64_t c = 0; c < visible; ++c) {
      multipliers[r * stride + c] =
          dropout_keep(key, row_first + static_cast<uint64_t>(c), threshold) ? scale : Scalar{0};
    }
  }
}

int64_t block_count(int64_t length, int64_t block) {
  return (length + block - 1) / block;
}

// This thread's part of the caller's scratch (attention_scratch_per_thread elements at its
// thread number), or, when the caller passed none, a buffer of its own; handed out in order.
template <typename Scalar>
class ThreadScratch {
 public:
  ThreadScratch(Scalar* shared, int64_t per_thread) {
    if (shared != nullptr) {
      next_ = shared + static_cast<int64_t>(omp_get_thread_num()) * per_thread;
    } else {
      own_.resize(static_cast<size_t>(per_thread));
      next_ = own_.data();
    }
  }
  std::span<Scalar> take(int64_t count) {
    const std::span<Scalar> piece(next_, static_cast<size_t>(count));
    next_ += count;
    return piece;
  }

 private:
  std::vector<Scalar> own_;
  Scalar* next_ = nullptr;
};

}  // namespace

int64_t attention_scratch_per_thread(int64_t seq_length, int64_t heads_per_group,
                                     const AttentionBlocks& blocks) {
  const int64_t block = blocks.query_rows * blocks.key_rows;
  const int64_t forward = 2 * block + 2 * blocks.query_rows;
  const int64_t backward = 4 * block + heads_per_group * seq_length;
  return std::max(forward, backward);
}

template <typename Scalar>
void attention_forward(Scalar* output, Scalar* logsumexp, const Scalar* qkv,
                       const AttentionShape& shape, const Dropout& dropout,
                       const AttentionBlocks& blocks, Scalar* scratch) {
  constexpr const char* op = "attention_forward";
  check_attention_dropout(dropout, op);
  const QkvLayout layout = check_shape(shape, blocks, op);
  const int64_t batch_size = shape.batch_size;
  const int64_t hidden_size = shape.hidden_size;
  const int64_t num_heads = shape.num_heads;
  const int64_t T = shape.seq_length;
  const int64_t HD = layout.head_dim;
  const int64_t stride = layout.row_width;
  const int64_t query_rows = blocks.query_rows;
  const int64_t key_rows = blocks.key_rows;
  const int64_t query_blocks = block_count(T, query_rows);
  const int64_t units = batch_size * num_heads * query_blocks;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(HD));
  const bool drop = dropout.active();
  const uint64_t mask_key = drop ? dropout.key_in_force() : 0;
  const uint64_t threshold = dropout.threshold();
  const Scalar dropout_scale = dropout.scale<Scalar>();
  constexpr Scalar kMinusInfinity = -std::numeric_limits<Scalar>::infinity();

#pragma omp parallel if (batch_size * num_heads * T * T * HD > detail::kParallelWork)
  {
    // Per thread: the score block (turned into weights in place), the dropout multipliers,
    // and the running row maximum and sum of the online softmax.
    ThreadScratch<Scalar> mine(
        scratch, attention_scratch_per_thread(T, layout.heads_per_group, blocks));
    const std::span<Scalar> scores = mine.take(query_rows * key_rows);
    const std::span<Scalar> multipliers = mine.take(drop ? query_rows * key_rows : 0);
    const std::span<Scalar> row_max = mine.take(query_rows);
    const std::span<Scalar> row_sum = mine.take(query_rows);
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t query_block = query_blocks - 1 - unit % query_blocks;
      const int64_t pair = unit / query_blocks;  // b · NH + h
      const int64_t b = pair / num_heads;
      const int64_t h = pair % num_heads;
      const int64_t group = h / layout.heads_per_group;
      const int64_t query_begin = query_block * query_rows;
      const int64_t rows = std::min(query_rows, T - query_begin);
      const Scalar* batch_qkv = qkv + b * T * stride;
      const Scalar* query = batch_qkv + query_begin * stride + layout.query_column(h);
      const Scalar* key = batch_qkv + layout.key_column(group);
      const Scalar* value = batch_qkv + layout.value_column(group);
      Scalar* out = output + (b * T + query_begin) * hidden_size + h * HD;
      const auto first = static_cast<uint64_t>(pair * T * T);
      std::fill_n(row_max.begin(), rows, kMinusInfinity);
      std::fill_n(row_sum.begin(), rows, Scalar{0});

      // Keys [0, query_begin + rows): the blocks at or below the diagonal.
      const int64_t key_end = query_begin + rows;
      for (int64_t key_begin = 0; key_begin < key_end; key_begin += key_rows) {
        const int64_t columns = std::min(key_rows, key_end - key_begin);
        // S (rows, columns) = scale · Q · K^T
        detail::gemm(Transpose::no, Transpose::yes, rows, columns, HD, scale, query, stride,
                     key + key_begin * stride, stride, Scalar{0}, scores.data(), key_rows);
        if (drop) {
          draw_dropout_block(multipliers.data(), key_rows, rows, columns, query_begin, key_begin, T,
                             first, mask_key, threshold, dropout_scale);
        }
        for (int64_t r = 0; r < rows; ++r) {
          Scalar* row = scores.data() + r * key_rows;
          const int64_t visible = visible_keys(query_begin + r, key_begin, columns);
          // The first key block shows every row at least key 0, so row_max is finite from
          // then on and a row that sees nothing of a later block keeps its maximum.
          Scalar new_max = row_max[r];
#pragma omp simd reduction(max : new_max)
          for (int64_t c = 0; c < visible; ++c) new_max = std::max(new_max, row[c]);
          const Scalar rescale = std::exp(row_max[r] - new_max);  // 0 on the first block
          Scalar sum = 0;
          if constexpr (std::is_same_v<Scalar, float>) {
#pragma omp simd
            for (int64_t c = 0; c < visible; ++c) row[c] = detail::fast_exp(row[c] - new_max);
            sum = detail::lane_sum(row, visible);
          } else {
            for (int64_t c = 0; c < visible; ++c) {
              row[c] = std::exp(row[c] - new_max);
              sum += row[c];
            }
          }
          std::fill(row + visible, row + columns, Scalar{0});
          row_sum[r] = row_sum[r] * rescale + sum;
          row_max[r] = new_max;
          if (drop) {
            const Scalar* multiplier = multipliers.data() + r * key_rows;
            for (int64_t c = 0; c < visible; ++c) row[c] *= multiplier[c];
          }
          if (key_begin > 0 && rescale != Scalar{1}) {
            Scalar* out_row = out + r * hidden_size;
            for (int64_t d = 0; d < HD; ++d) out_row[d] *= rescale;
          }
        }
        // O (rows, HD) = O · rescale + weights (rows, columns) · V (columns, HD)
        detail::gemm(Transpose::no, Transpose::no, rows, HD, columns, Scalar{1}, scores.data(),
                     key_rows, value + key_begin * stride, stride,
                     key_begin == 0 ? Scalar{0} : Scalar{1}, out, hidden_size);
      }
      Scalar* row_logsumexp = logsumexp + pair * T + query_begin;
      for (int64_t r = 0; r < rows; ++r) {
        // No mass (a diverged model's NaN/Inf scores): the output is NaN, as 0 · (1/0) would
        // make it, without dividing by zero (undefined behaviour, which the sanitized build
        // reports). Otherwise exactly 1 / sum.
        const Scalar inverse_sum = row_sum[r] > Scalar{0} || std::isnan(row_sum[r])
                                       ? Scalar{1} / row_sum[r]
                                       : std::numeric_limits<Scalar>::quiet_NaN();
        Scalar* out_row = out + r * hidden_size;
        for (int64_t d = 0; d < HD; ++d) out_row[d] *= inverse_sum;
        row_logsumexp[r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  }
}

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* doutput, const Scalar* qkv,
                        const Scalar* output, const Scalar* logsumexp, const AttentionShape& shape,
                        const Dropout& dropout, const AttentionBlocks& blocks, Scalar* scratch) {
  constexpr const char* op = "attention_backward";
  check_attention_dropout(dropout, op);
  const QkvLayout layout = check_shape(shape, blocks, op);
  const int64_t batch_size = shape.batch_size;
  const int64_t hidden_size = shape.hidden_size;
  const int64_t num_heads = shape.num_heads;
  const int64_t num_query_groups = shape.num_query_groups;
  const int64_t T = shape.seq_length;
  const int64_t HD = layout.head_dim;
  const int64_t stride = layout.row_width;
  const int64_t heads_per_group = layout.heads_per_group;
  const int64_t query_rows = blocks.query_rows;
  const int64_t key_rows = blocks.key_rows;
  const int64_t units = batch_size * num_query_groups;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(HD));
  const bool drop = dropout.active();
  const uint64_t mask_key = drop ? dropout.key_in_force() : 0;
  const uint64_t threshold = dropout.threshold();
  const Scalar dropout_scale = dropout.scale<Scalar>();

#pragma omp parallel if (batch_size * num_heads * T * T * HD > detail::kParallelWork)
  {
    // Per thread: P, then D when dropping; dP, then dS; the dropout multipliers; Δ of the
    // group's heads (heads_per_group × T).
    const int64_t block_size = query_rows * key_rows;
    ThreadScratch<Scalar> mine(scratch, attention_scratch_per_thread(T, heads_per_group, blocks));
    const std::span<Scalar> probabilities = mine.take(block_size);
    const std::span<Scalar> dropped = mine.take(drop ? block_size : 0);
    const std::span<Scalar> dscores = mine.take(block_size);
    const std::span<Scalar> multipliers = mine.take(drop ? block_size : 0);
    const std::span<Scalar> delta = mine.take(heads_per_group * T);
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t b = unit / num_query_groups;
      const int64_t group = unit % num_query_groups;
      const int64_t group_column = layout.group_column(group);
      const int64_t group_width = (heads_per_group + 2) * HD;
      const Scalar* batch_qkv = qkv + b * T * stride;
      Scalar* batch_dqkv = dqkv + b * T * stride;
      const Scalar* key = batch_qkv + layout.key_column(group);
      const Scalar* value = batch_qkv + layout.value_column(group);
      Scalar* dkey = batch_dqkv + layout.key_column(group);
      Scalar* dvalue = batch_dqkv + layout.value_column(group);

      // The group's columns of dqkv are summed into from here on.
      for (int64_t t = 0; t < T; ++t) {
        std::fill_n(batch_dqkv + t * stride + group_column, group_width, Scalar{0});
      }
      for (int64_t head = 0; head < heads_per_group; ++head) {
        const int64_t h = group * heads_per_group + head;
        const Scalar* o = output + b * T * hidden_size + h * HD;
        const Scalar* dout = doutput + b * T * hidden_size + h * HD;
        for (int64_t t = 0; t < T; ++t) {
          Scalar sum = 0;
          for (int64_t d = 0; d < HD; ++d)
            sum += dout[t * hidden_size + d] * o[t * hidden_size + d];
          delta[static_cast<size_t>(head * T + t)] = sum;
        }
      }

      for (int64_t key_begin = 0; key_begin < T; key_begin += key_rows) {
        const int64_t columns = std::min(key_rows, T - key_begin);
        const Scalar* key_block = key + key_begin * stride;
        const Scalar* value_block = value + key_begin * stride;
        Scalar* dkey_block = dkey + key_begin * stride;
        Scalar* dvalue_block = dvalue + key_begin * stride;
        for (int64_t head = 0; head < heads_per_group; ++head) {
          const int64_t h = group * heads_per_group + head;
          const int64_t pair = b * num_heads + h;
          const auto first = static_cast<uint64_t>(pair * T * T);
          const Scalar* head_logsumexp = logsumexp + pair * T;
          const Scalar* head_delta = delta.data() + head * T;
          // Query blocks that reach key_begin: the first is the one holding row key_begin.
          for (int64_t query_begin = key_begin / query_rows * query_rows; query_begin < T;
               query_begin += query_rows) {
            const int64_t rows = std::min(query_rows, T - query_begin);
            const Scalar* query = batch_qkv + query_begin * stride + layout.query_column(h);
            Scalar* dquery = batch_dqkv + query_begin * stride + layout.query_column(h);
            const Scalar* dout = doutput + (b * T + query_begin) * hidden_size + h * HD;

            // P (rows, columns) = exp(scale · Q · K^T − L), zero above the diagonal
            detail::gemm(Transpose::no, Transpose::yes, rows, columns, HD, scale, query, stride,
                         key_block, stride, Scalar{0}, probabilities.data(), key_rows);
            for (int64_t r = 0; r < rows; ++r) {
              Scalar* row = probabilities.data() + r * key_rows;
              const int64_t visible = visible_keys(query_begin + r, key_begin, columns);
              const Scalar row_logsumexp = head_logsumexp[query_begin + r];
              if constexpr (std::is_same_v<Scalar, float>) {
#pragma omp simd
                for (int64_t c = 0; c < visible; ++c) {
                  row[c] = detail::fast_exp(row[c] - row_logsumexp);
                }
              } else {
                for (int64_t c = 0; c < visible; ++c) row[c] = std::exp(row[c] - row_logsumexp);
              }
              std::fill(row + visible, row + columns, Scalar{0});
            }
            const Scalar* weights = probabilities.data();
            if (drop) {
              draw_dropout_block(multipliers.data(), key_rows, rows, columns, query_begin,
                                 key_begin, T, first, mask_key, threshold, dropout_scale);
              for (int64_t r = 0; r < rows; ++r) {
                const int64_t visible = visible_keys(query_begin + r, key_begin, columns);
                const int64_t offset = r * key_rows;
                for (int64_t c = 0; c < visible; ++c) {
                  dropped[offset + c] = probabilities[offset + c] * multipliers[offset + c];
                }
                std::fill(dropped.begin() + offset + visible, dropped.begin() + offset + columns,
                          Scalar{0});
              }
              weights = dropped.data();
            }
            // dV (columns, HD) += D^T · dO (rows, HD)
            detail::gemm(Transpose::yes, Transpose::no, columns, HD, rows, Scalar{1}, weights,
                         key_rows, dout, hidden_size, Scalar{1}, dvalue_block, stride);
            // dD (rows, columns) = dO · V^T; dP = dD · multiplier; dS = P ∘ (dP − Δ)
            detail::gemm(Transpose::no, Transpose::yes, rows, columns, HD, Scalar{1}, dout,
                         hidden_size, value_block, stride, Scalar{0}, dscores.data(), key_rows);
            for (int64_t r = 0; r < rows; ++r) {
              const Scalar* p = probabilities.data() + r * key_rows;
              Scalar* ds = dscores.data() + r * key_rows;
              const int64_t visible = visible_keys(query_begin + r, key_begin, columns);
              const Scalar row_delta = head_delta[query_begin + r];
              if (drop) {
                const Scalar* multiplier = multipliers.data() + r * key_rows;
                for (int64_t c = 0; c < visible; ++c) {
                  ds[c] = p[c] * (ds[c] * multiplier[c] - row_delta);
                }
              } else {
                for (int64_t c = 0; c < visible; ++c) ds[c] = p[c] * (ds[c] - row_delta);
              }
              std::fill(ds + visible, ds + columns, Scalar{0});
            }
            // dQ (rows, HD) += scale · dS · K (columns, HD)
            detail::gemm(Transpose::no, Transpose::no, rows, HD, columns, scale, dscores.data(),
                         key_rows, key_block, stride, Scalar{1}, dquery, stride);
            // dK (columns, HD) += scale · dS^T · Q (rows, HD)
            detail::gemm(Transpose::yes, Transpose::no, columns, HD, rows, scale, dscores.data(),
                         key_rows, query, stride, Scalar{1}, dkey_block, stride);
          }
        }
      }
    }
  }
}

// The cached attention: keys in chunks of kCacheChunk positions, whose scores sit on the stack,
// with the online softmax across chunks (the running maximum and sum; the partial output, kept
// in the output row itself, rescaled when the maximum grows).
template <typename Scalar>
void kv_cache_attention_forward(Scalar* output, Scalar* key_cache, Scalar* value_cache,
                                const Scalar* qkv, const int32_t* slots,
                                const int32_t* positions, int64_t rows, int64_t num_heads,
                                int64_t num_query_groups, int64_t head_dim, int64_t max_length) {
  const int64_t HD = head_dim;
  const int64_t NG = num_query_groups;
  const int64_t heads_per_group = num_heads / NG;
  const int64_t group_width = (heads_per_group + 2) * HD;
  const int64_t qkv_width = NG * group_width;
  const int64_t position_stride = NG * HD;  // between a slot's consecutive positions
  const int64_t slot_stride = max_length * position_stride;

#pragma omp parallel for if (rows * qkv_width > detail::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t place = int64_t{slots[r]} * slot_stride + int64_t{positions[r]} * position_stride;
    for (int64_t g = 0; g < NG; ++g) {
      const Scalar* key = qkv + r * qkv_width + g * group_width + heads_per_group * HD;
      const Scalar* value = key + HD;
      Scalar* key_to = key_cache + place + g * HD;
      Scalar* value_to = value_cache + place + g * HD;
      for (int64_t d = 0; d < HD; ++d) {
        key_to[d] = key[d];
        value_to[d] = value[d];
      }
    }
  }

  int64_t key_work = 0;  // multiply-adds of the scores
  for (int64_t r = 0; r < rows; ++r) key_work += (int64_t{positions[r]} + 1) * num_heads * HD;
  constexpr int64_t kCacheChunk = 64;
  const Scalar scale = Scalar{1} / std::sqrt(static_cast<Scalar>(HD));
  const int64_t units = rows * num_heads;
#pragma omp parallel for schedule(dynamic, 1) if (key_work > detail::kParallelWork)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t r = unit / num_heads;
    const int64_t h = unit % num_heads;
    const int64_t g = h / heads_per_group;
    const Scalar* query = qkv + r * qkv_width + g * group_width + (h % heads_per_group) * HD;
    Scalar* out = output + r * num_heads * HD + h * HD;
    const Scalar* keys = key_cache + int64_t{slots[r]} * slot_stride + g * HD;
    const Scalar* values = value_cache + int64_t{slots[r]} * slot_stride + g * HD;
    const int64_t length = int64_t{positions[r]} + 1;
    for (int64_t d = 0; d < HD; ++d) out[d] = Scalar{0};
    Scalar running_max = -std::numeric_limits<Scalar>::infinity();
    Scalar running_sum = 0;
    Scalar scores[kCacheChunk];
    for (int64_t begin = 0; begin < length; begin += kCacheChunk) {
      const int64_t count = std::min(kCacheChunk, length - begin);
      Scalar chunk_max = -std::numeric_limits<Scalar>::infinity();
      for (int64_t i = 0; i < count; ++i) {
        const Scalar* key = keys + (begin + i) * position_stride;
        Scalar dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < HD; ++d) dot += query[d] * key[d];
        scores[i] = dot * scale;
        chunk_max = std::max(chunk_max, scores[i]);
      }
      const Scalar new_max = std::max(running_max, chunk_max);
      if (new_max > running_max && begin > 0) {
        const Scalar correction = std::exp(running_max - new_max);
        running_sum *= correction;
        for (int64_t d = 0; d < HD; ++d) out[d] *= correction;
      }
      running_max = new_max;
      for (int64_t i = 0; i < count; ++i) {
        const Scalar weight = std::exp(scores[i] - running_max);
        running_sum += weight;
        const Scalar* value = values + (begin + i) * position_stride;
#pragma omp simd
        for (int64_t d = 0; d < HD; ++d) out[d] += weight * value[d];
      }
    }
    // As attention_forward's: no mass gives NaN, without dividing by zero.
    const Scalar inverse = running_sum > Scalar{0} || std::isnan(running_sum)
                               ? Scalar{1} / running_sum
                               : std::numeric_limits<Scalar>::quiet_NaN();
    for (int64_t d = 0; d < HD; ++d) out[d] *= inverse;
  }
}

#define BACKEND_INSTANTIATE_ATTENTION(Scalar)                                                     \
  template void attention_forward<Scalar>(Scalar*, Scalar*, const Scalar*, const AttentionShape&, \
                                          const Dropout&, const AttentionBlocks&, Scalar*);       \
  template void attention_backward<Scalar>(Scalar*, const Scalar*, const Scalar*, const Scalar*,  \
                                           const Scalar*, const AttentionShape&, const Dropout&,  \
                                           const AttentionBlocks&, Scalar*);                      \
  template void kv_cache_attention_forward<Scalar>(Scalar*, Scalar*, Scalar*, const Scalar*,      \
                                                   const int32_t*, const int32_t*, int64_t,       \
                                                   int64_t, int64_t, int64_t, int64_t);
BACKEND_INSTANTIATE_ATTENTION(float)
BACKEND_INSTANTIATE_ATTENTION(double)
#undef BACKEND_INSTANTIATE_ATTENTION

}  // namespace backend::cpu
