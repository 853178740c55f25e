// attention.hpp's forward and backward through cuDNN's fused flash attention: the composite
// graph cuDNN's frontend builds for scaled dot-product attention below cuDNN 9.21, described
// here through the graph API (docs/cudnn_attention.md; the operations, types and strides
// follow NVIDIA/cudnn-frontend's CompositeSDPANode and CompositeSDPABackwardNode, v1.23.0,
// read, not copied). Per (batch, head), with S the scaled scores and the causal mask:
//   forward   Stats = max_j S + log Σ_j exp(S − max_j S)   (our logsumexp: natural log)
//             O = (softmax(S) ∘ R / (1 − p)) · V
//   backward  softmax_sum = rowsum(dO ∘ O) · (1 − p),  P = exp(S − Stats)
//             dV = (P ∘ R / (1 − p))ᵀ · dO,  dS = P ∘ (dO · Vᵀ ∘ R − softmax_sum) / (1 − p) · scale
//             dK = dSᵀ · Q,  dQ = dS · K
// with attention dropout p the keep mask R: cuDNN's Philox draws (Bernoulli 1 − p) from a seed,
// the mask's key, and offset 0, so the backward regenerates the forward's R (without dropout
// R = 1, p = 0 and those operations are left out). R is not the CPU twin's mask (dropout.hpp),
// so with dropout a call runs on cuDNN only where both directions do (a forward on cuDNN with a
// backward on our kernel would differentiate another mask).
// The backward is the deterministic form: dQ is one matmul's output, with no fp32 accumulator
// that cuDNN's engines sum into in any order (the frontend's is_deterministic_algorithm).
// The qkv row is Megatron core's grouped layout (attention.hpp): Q, K and V are strided views
// of it for multi-head (NG = NH) and multi-query (NG = 1) attention; grouped-query attention's
// queries are not one strided tensor, so they are gathered into blocked (B, T, NH, HD) order
// in the scratch first (and dQ scattered back). K and V are strided views in every case.
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/device/cudnn_graph.cuh"
#include "backend/device/cudnn_library.cuh"
#include "backend/ops/attention.hpp"
#include "backend/ops/cuda_common.cuh"

namespace backend::cuda {
namespace {

// The graph's external tensors, by the unique ids the variant pack names them with; the
// virtual tensors take ids from CudnnGraph's own counter, which starts above these.
enum Uid : int64_t {
  kQ = 1,
  kKT,
  kVT,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kAttnScale,
  kNegativeInfinity,
  kKeepProbability,
  kSoftmaxSum,
  kSeed,
  kOffset,
  kDropScale,
};

constexpr int64_t kAlignment = 256;  // of each region carved from the scratch
int64_t aligned(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Where Q, K and V sit: element offsets into the qkv row and the strides of [B, H, T, HD].
struct AttentionLayout {
  int64_t batch, heads, groups, seq, head_dim;
  bool queries_blocked;  // GQA: Q (and dQ) in (B, T, NH, HD) scratch
  std::array<int64_t, 4> q_strides, kv_strides, o_strides;
  int64_t k_offset, v_offset;

  explicit AttentionLayout(const AttentionShape& shape)
      : batch(shape.batch_size),
        heads(shape.num_heads),
        groups(shape.num_query_groups),
        seq(shape.seq_length),
        head_dim(shape.head_dim()) {
    const int64_t per_group = shape.heads_per_group();
    const int64_t width = shape.qkv_row_width();
    queries_blocked = per_group != 1 && groups != 1;
    const int64_t query_head_stride = groups == heads ? 3 * head_dim : head_dim;
    q_strides = queries_blocked
                    ? std::array<int64_t, 4>{seq * heads * head_dim, head_dim, heads * head_dim, 1}
                    : std::array<int64_t, 4>{seq * width, query_head_stride, width, 1};
    kv_strides = {seq * width, (per_group + 2) * head_dim, width, 1};
    o_strides = {seq * heads * head_dim, head_dim, heads * head_dim, 1};
    k_offset = per_group * head_dim;
    v_offset = (per_group + 1) * head_dim;
  }
  std::array<int64_t, 4> q_dims() const { return {batch, heads, seq, head_dim}; }
  std::array<int64_t, 4> kv_dims() const { return {batch, groups, seq, head_dim}; }
  // K (or V) described transposed: [B, NG, HD, T], the last two strides swapped.
  std::array<int64_t, 4> transposed_kv_dims() const { return {batch, groups, head_dim, seq}; }
  std::array<int64_t, 4> transposed_kv_strides() const {
    return {kv_strides[0], kv_strides[1], kv_strides[3], kv_strides[2]};
  }
  std::array<int64_t, 4> score_dims() const { return {batch, heads, seq, seq}; }
  std::array<int64_t, 4> row_dims() const { return {batch, heads, seq, 1}; }
  int64_t blocked_query_bytes(int64_t element_bytes) const {
    return queries_blocked ? aligned(batch * seq * heads * head_dim * element_bytes) : 0;
  }
};

CudnnTensorSpec spec(std::array<int64_t, 4> dims, cudnnDataType_t type,
                     CudnnTensorKind kind = CudnnTensorKind::virtual_tensor, int64_t uid = 0) {
  return {.dims = dims, .strides = packed_strides(dims), .type = type, .kind = kind, .uid = uid};
}
CudnnTensorSpec spec(std::array<int64_t, 4> dims, std::array<int64_t, 4> strides,
                     cudnnDataType_t type, CudnnTensorKind kind = CudnnTensorKind::virtual_tensor,
                     int64_t uid = 0) {
  return {.dims = dims, .strides = strides, .type = type, .kind = kind, .uid = uid};
}

constexpr auto kIo = CudnnTensorKind::io;
constexpr cudnnDataType_t kFloat = CUDNN_DATA_FLOAT;

// The causal mask on scores x: positions j > i become −inf (the frontend's diagonal band with
// right bound 0: GEN_INDEX of rows and columns, row ≥ column, BINARY_SELECT(x, −inf, keep)).
CudnnTensor causal_mask(CudnnGraph& graph, CudnnTensor scores, CudnnTensor negative_infinity,
                        const AttentionLayout& layout) {
  const auto dims = layout.score_dims();
  const CudnnTensor row =
      graph.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, spec(dims, CUDNN_DATA_INT32),
                      "the row index", kFloat, {}, {}, 2);
  const CudnnTensor column =
      graph.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, spec(dims, CUDNN_DATA_INT32),
                      "the column index", kFloat, {}, {}, 3);
  const CudnnTensor keep =
      graph.pointwise(CUDNN_POINTWISE_CMP_GE, row, spec(dims, CUDNN_DATA_BOOLEAN),
                      "the causal mask", CUDNN_DATA_BOOLEAN, column);
  return graph.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, spec(dims, kFloat),
                         "the masked scores", kFloat, negative_infinity, keep);
}

// The dropout keep mask R over the scores (Bernoulli 1 − p from the seed and offset, INT64
// tensors in device memory: a captured step reads the key staged for each replay) and the
// by-value scale 1/(1 − p).
struct DropoutTensors {
  CudnnTensor mask, scale;
};
DropoutTensors describe_dropout(CudnnGraph& graph, const AttentionLayout& layout,
                                double probability) {
  const auto state = [](int64_t uid) {
    return CudnnTensorSpec{.dims = {1, 1, 1, 1},
                           .strides = {1, 1, 1, 1},
                           .type = CUDNN_DATA_INT64,
                           .kind = kIo,
                           .uid = uid};
  };
  const CudnnTensor seed = graph.tensor(state(kSeed), "the dropout seed");
  const CudnnTensor offset = graph.tensor(state(kOffset), "the dropout offset");
  return {.mask = graph.bernoulli(1.0 - probability, seed, offset,
                                  spec(layout.score_dims(), kFloat), "the dropout mask"),
          .scale = graph.scalar(kDropScale, "the dropout scale")};
}

// dropout_probability 0: no dropout operations.
CudnnGraph describe_forward(const AttentionLayout& layout, cudnnDataType_t io,
                            double dropout_probability) {
  CudnnGraph graph;
  const auto scores = layout.score_dims();
  const auto rows = layout.row_dims();
  const CudnnTensor q = graph.tensor(spec(layout.q_dims(), layout.q_strides, io, kIo, kQ), "Q");
  const CudnnTensor kt = graph.tensor(
      spec(layout.transposed_kv_dims(), layout.transposed_kv_strides(), io, kIo, kKT), "Kᵀ");
  const CudnnTensor v = graph.tensor(spec(layout.kv_dims(), layout.kv_strides, io, kIo, kV), "V");
  const CudnnTensor attn_scale = graph.scalar(kAttnScale, "the attention scale");
  const CudnnTensor negative_infinity = graph.scalar(kNegativeInfinity, "−inf");

  CudnnTensor s = graph.matmul(q, kt, spec(scores, kFloat), "Q·Kᵀ");
  s = graph.pointwise(CUDNN_POINTWISE_MUL, s, spec(scores, kFloat), "the scaled scores", kFloat,
                      attn_scale);
  s = causal_mask(graph, s, negative_infinity, layout);
  const CudnnTensor max =
      graph.reduction(CUDNN_REDUCE_TENSOR_MAX, s, spec(rows, kFloat), "the row maximum");
  CudnnTensor e = graph.pointwise(CUDNN_POINTWISE_SUB, s, spec(scores, kFloat),
                                  "the shifted scores", kFloat, max);
  e = graph.pointwise(CUDNN_POINTWISE_EXP, e, spec(scores, kFloat), "the exponentials");
  const CudnnTensor sum =
      graph.reduction(CUDNN_REDUCE_TENSOR_ADD, e, spec(rows, kFloat), "the row sum");
  const CudnnTensor log_sum =
      graph.pointwise(CUDNN_POINTWISE_LOG, sum, spec(rows, kFloat), "the log of the row sum");
  graph.pointwise(CUDNN_POINTWISE_ADD, max, spec(rows, kFloat, kIo, kStats), "Stats", kFloat,
                  log_sum);
  const bool dropout = dropout_probability > 0;
  CudnnTensor p = graph.pointwise(CUDNN_POINTWISE_DIV, e, spec(scores, dropout ? kFloat : io),
                                  "the probabilities", kFloat, sum);
  if (dropout) {
    const DropoutTensors mask = describe_dropout(graph, layout, dropout_probability);
    p = graph.pointwise(CUDNN_POINTWISE_MUL, p, spec(scores, kFloat), "P∘R", kFloat, mask.mask);
    p = graph.pointwise(CUDNN_POINTWISE_MUL, p, spec(scores, io), "P∘R/(1 − p)", kFloat,
                        mask.scale);
  }
  graph.matmul(p, v, spec(layout.q_dims(), layout.o_strides, io, kIo, kO), "P·V");
  return graph;
}

// A gradient of K or V ([B, NG, T, HD] at the qkv's strides) from a product over all NH query
// heads: straight into it for multi-head attention, else the heads' full product reduced over
// each group's heads (the frontend's dK_fullhead/dV_fullhead).
void group_gradient(CudnnGraph& graph, CudnnTensor a, CudnnTensor b, const AttentionLayout& layout,
                    cudnnDataType_t io, int64_t uid, const char* what) {
  const auto gradient = spec(layout.kv_dims(), layout.kv_strides, io, kIo, uid);
  if (layout.groups == layout.heads) {
    graph.matmul(a, b, gradient, what);
    return;
  }
  const CudnnTensor full = graph.matmul(a, b, spec(layout.q_dims(), io), what);
  graph.reduction(CUDNN_REDUCE_TENSOR_ADD, full, gradient, what);
}

CudnnGraph describe_backward(const AttentionLayout& layout, cudnnDataType_t io,
                             double dropout_probability) {
  CudnnGraph graph;
  const bool dropout = dropout_probability > 0;
  // R first, as cuDNN's frontend orders it.
  const DropoutTensors mask =
      dropout ? describe_dropout(graph, layout, dropout_probability) : DropoutTensors{};
  const auto scores = layout.score_dims();
  const auto rows = layout.row_dims();
  // Pᵀ and dSᵀ: the scores' [B, NH, T, T] read transposed.
  const std::array<int64_t, 4> transposed_score_strides = {layout.heads * layout.seq * layout.seq,
                                                           layout.seq * layout.seq, 1, layout.seq};
  const CudnnTensor q = graph.tensor(spec(layout.q_dims(), layout.q_strides, io, kIo, kQ), "Q");
  const CudnnTensor kt = graph.tensor(
      spec(layout.transposed_kv_dims(), layout.transposed_kv_strides(), io, kIo, kKT), "Kᵀ");
  const CudnnTensor vt = graph.tensor(
      spec(layout.transposed_kv_dims(), layout.transposed_kv_strides(), io, kIo, kVT), "Vᵀ");
  const CudnnTensor o = graph.tensor(spec(layout.q_dims(), layout.o_strides, io, kIo, kO), "O");
  const CudnnTensor d_o = graph.tensor(spec(layout.q_dims(), layout.o_strides, io, kIo, kDO), "dO");
  const CudnnTensor stats = graph.tensor(spec(rows, kFloat, kIo, kStats), "Stats");
  const CudnnTensor attn_scale = graph.scalar(kAttnScale, "the attention scale");
  const CudnnTensor negative_infinity = graph.scalar(kNegativeInfinity, "−inf");
  const CudnnTensor keep_probability = graph.scalar(kKeepProbability, "1 − p");

  // softmax_sum = rowsum(dO ∘ O), in the workspace. The product's strides are the frontend's.
  const CudnnTensor product =
      graph.pointwise(CUDNN_POINTWISE_MUL, d_o,
                      spec(layout.q_dims(),
                           {layout.heads * layout.seq * layout.head_dim,
                            layout.seq * layout.head_dim, layout.heads * layout.head_dim, 1},
                           kFloat),
                      "dO∘O", kFloat, o);
  const CudnnTensor row_sum =
      graph.reduction(CUDNN_REDUCE_TENSOR_ADD, product, spec(rows, kFloat), "rowsum(dO∘O)");
  const CudnnTensor softmax_sum =
      graph.pointwise(CUDNN_POINTWISE_MUL, row_sum, spec(rows, kFloat, kIo, kSoftmaxSum),
                      "softmax_sum", kFloat, keep_probability);

  CudnnTensor s = graph.matmul(q, kt, spec(scores, kFloat), "Q·Kᵀ");
  s = graph.pointwise(CUDNN_POINTWISE_MUL, s, spec(scores, kFloat), "the scaled scores", kFloat,
                      attn_scale);
  s = graph.pointwise(CUDNN_POINTWISE_SUB, s, spec(scores, kFloat), "S − Stats", kFloat, stats);
  s = causal_mask(graph, s, negative_infinity, layout);
  const CudnnTensor p =
      graph.pointwise(CUDNN_POINTWISE_EXP, s, spec(scores, kFloat), "the probabilities");
  CudnnTensor kept = p;
  if (dropout) {
    kept =
        graph.pointwise(CUDNN_POINTWISE_MUL, kept, spec(scores, kFloat), "P∘R", kFloat, mask.mask);
    kept = graph.pointwise(CUDNN_POINTWISE_MUL, kept, spec(scores, kFloat), "P∘R/(1 − p)", kFloat,
                           mask.scale);
  }
  const CudnnTensor pt = graph.reshape(kept, spec(scores, transposed_score_strides, io), "Pᵀ");
  group_gradient(graph, pt, d_o, layout, io, kDV, "Pᵀ·dO");

  CudnnTensor ds = graph.matmul(d_o, vt, spec(scores, kFloat), "dO·Vᵀ");
  if (dropout) {
    ds = graph.pointwise(CUDNN_POINTWISE_MUL, ds, spec(scores, kFloat), "dP∘R", kFloat, mask.mask);
  }
  ds = graph.pointwise(CUDNN_POINTWISE_SUB, ds, spec(scores, kFloat), "dP − softmax_sum", kFloat,
                       softmax_sum);
  ds = graph.pointwise(CUDNN_POINTWISE_MUL, ds, spec(scores, kFloat), "P∘(dP − softmax_sum)",
                       kFloat, p);
  if (dropout) {
    ds = graph.pointwise(CUDNN_POINTWISE_MUL, ds, spec(scores, kFloat), "dS/(1 − p)", kFloat,
                         mask.scale);
  }
  ds = graph.pointwise(CUDNN_POINTWISE_MUL, ds, spec(scores, kFloat), "dS", kFloat, attn_scale);
  const CudnnTensor dst = graph.reshape(ds, spec(scores, transposed_score_strides, io), "dSᵀ");
  group_gradient(graph, dst, q, layout, io, kDK, "dSᵀ·Q");
  const CudnnTensor k = graph.reshape(kt, spec(layout.kv_dims(), layout.kv_strides, kFloat), "K");
  graph.matmul(ds, k, spec(layout.q_dims(), layout.q_strides, io, kIo, kDQ), "dS·K");
  return graph;
}

template <typename Scalar>
cudnnDataType_t cudnn_type() {
  if constexpr (std::is_same_v<Scalar, bfloat16>)
    return CUDNN_DATA_BFLOAT16;
  else
    return CUDNN_DATA_HALF;
}

// Why cuDNN's attention cannot run this call, or "" (the known gates, checked before any graph
// is built, so the log line can name them: docs/cudnn_attention.md, sections 0, 3 and 5).
// With dropout the backward's gates hold for the forward too (both directions or neither).
std::string gate(const AttentionShape& shape, const Dropout& dropout, bool backward,
                 int64_t version, int compute_capability) {
  const int64_t head_dim = shape.head_dim();
  if (compute_capability < 80) {
    return fmt::format(
        "cuDNN's fused attention needs compute capability 8.0 or later (this GPU "
        "has {}.{})",
        compute_capability / 10, compute_capability % 10);
  }
  if (head_dim % 8 != 0 || head_dim > (compute_capability == 90 ? 256 : 128)) {
    return fmt::format(
        "head dimension {} (cuDNN's fused attention takes multiples of 8 up to "
        "128, 256 on sm90)",
        head_dim);
  }
  if (version == 91000 || version == 91001) {
    return "cuDNN 9.10.0 and 9.10.1 have known bugs in 16-bit fused attention";
  }
  if (dropout.active() && version > 91100 && version < 91400) {
    return fmt::format("attention dropout on cuDNN {} (PyTorch refuses 9.11.1-9.13.x for it)",
                       version);
  }
  if (shape.seq_length < 2) return "a sequence of one position";
  if ((backward || dropout.active()) && version < 91501 && shape.seq_length % 128 != 0) {
    return fmt::format(
        "the backward before cuDNN 9.15.1 needs a sequence length that is a "
        "multiple of 128 (got {})",
        shape.seq_length);
  }
  return {};
}

// A plan (or refusal) per direction, type, shape and attention dropout probability (the
// graph's Bernoulli draws are 1 − p; an evaluation call, p = 0, has no dropout operations).
std::vector<int64_t> plan_key(bool backward, cudnnDataType_t io, const AttentionShape& shape,
                              const Dropout& dropout) {
  return {
      backward ? 1 : 0,       static_cast<int64_t>(io),
      shape.batch_size,       shape.seq_length,
      shape.hidden_size,      shape.num_heads,
      shape.num_query_groups, std::bit_cast<int64_t>(dropout.active() ? dropout.probability : 0.0)};
}

// The caller's part of cuDNN's workspace, after the plan's own, in 256-byte aligned regions:
// the dropout RNG state (seed, then offset 16 bytes on), softmax_sum (backward), then for GQA
// the blocked Q and (backward) dQ. -1: no such region.
struct CallerRegions {
  int64_t rng_state = -1, softmax_sum = -1, blocked_queries = -1, blocked_query_gradients = -1;
  int64_t bytes = 0;

  CallerRegions() = default;
  CallerRegions(const AttentionLayout& layout, bool backward, bool dropout, int64_t element_bytes) {
    const auto take = [&](int64_t size) {
      const int64_t at = bytes;
      bytes += aligned(size);
      return at;
    };
    if (dropout) rng_state = take(2 * kRngStateStride);
    if (backward) {
      softmax_sum = take(layout.batch * layout.heads * layout.seq * int64_t{sizeof(float)});
    }
    if (layout.queries_blocked) {
      blocked_queries = take(layout.blocked_query_bytes(element_bytes));
      if (backward) blocked_query_gradients = take(layout.blocked_query_bytes(element_bytes));
    }
  }
  static constexpr int64_t kRngStateStride = 16;  // bytes: the graph's tensors' alignment
};

// Writes the dropout RNG's state into the workspace: the seed (the mask's key, read from device
// memory where it is staged for a captured step) and the offset 0. One thread, queued before
// the plan, so a replayed capture reads each replay's key.
__global__ void stage_dropout_state_kernel(int64_t* seed, int64_t* offset,
                                           const uint64_t* stored_key, uint64_t key) {
  *seed = static_cast<int64_t>(stored_key != nullptr ? *stored_key : key);
  *offset = 0;
}

// Gathers each row's NH queries into blocked (B·T, NH, HD) order, or (scatter) back: one thread
// per 16-byte pack.
template <typename T, bool kScatter>
__global__ void blocked_queries_kernel(T* blocked, T* qkv, int64_t rows, int64_t heads,
                                       int64_t per_group, int64_t head_dim, int64_t width) {
  constexpr int kWidth = detail::kPackWidth<T>;
  const int64_t packs_per_head = head_dim / kWidth;
  const int64_t total = rows * heads * packs_per_head;
  for (int64_t index : detail::grid_stride(total)) {
    const int64_t pack = index % packs_per_head;
    const int64_t head = index / packs_per_head % heads;
    const int64_t row = index / (packs_per_head * heads);
    const int64_t group = head / per_group;
    T* packed = blocked + (row * heads + head) * head_dim + pack * kWidth;
    T* strided =
        qkv + row * width + (group * (per_group + 2) + head % per_group) * head_dim + pack * kWidth;
    using Pack = detail::Pack<T, kWidth>;
    if constexpr (kScatter) {
      *reinterpret_cast<Pack*>(strided) = *reinterpret_cast<const Pack*>(packed);
    } else {
      *reinterpret_cast<Pack*>(packed) = *reinterpret_cast<const Pack*>(strided);
    }
  }
}

template <bool kScatter, typename Scalar>
void move_blocked_queries(Scalar* blocked, const Scalar* qkv, const AttentionShape& shape,
                          cudaStream_t stream) {
  using T = detail::DeviceElementOf<Scalar>;
  const int64_t rows = shape.batch_size * shape.seq_length;
  const int64_t packs = rows * shape.num_heads * shape.head_dim() / detail::kPackWidth<T>;
  blocked_queries_kernel<T, kScatter><<<detail::grid_for(packs), detail::kBlockSize, 0, stream>>>(
      detail::device_pointer(blocked), const_cast<T*>(detail::device_pointer(qkv)), rows,
      shape.num_heads, shape.heads_per_group(), shape.head_dim(), shape.qkv_row_width());
  CUDA_CHECK(cudaGetLastError());
}

// The workspace's caller regions of a call: `base` is where they start, after the plan's own.
struct CallWorkspace {
  char* base;
  CallerRegions regions;
  template <typename T>
  T* at(int64_t offset) const {
    return reinterpret_cast<T*>(base + offset);
  }
};

// The plan for this call and its workspace, or the outcome that says why there is none.
struct Planned {
  const CudnnPlan* plan = nullptr;
  CudnnAttentionOutcome outcome;
  CallWorkspace workspace{};
};

template <typename Scalar>
Planned find_plan(const CudaContext& context, const AttentionShape& shape, const Dropout& dropout,
                  bool backward) {
  Planned planned;
  if (context.cudnn_plans == nullptr) {
    planned.outcome.refusal = "this device was made without cuDNN";
    return planned;
  }
  CudnnPlans& plans = *context.cudnn_plans;
  const cudnnDataType_t io = cudnn_type<Scalar>();
  const AttentionLayout layout(shape);
  const double probability = dropout.active() ? dropout.probability : 0.0;
  const CallerRegions regions(layout, backward, dropout.active(), sizeof(Scalar));
  const auto lookup = [&](bool direction, int64_t caller_bytes) {
    const std::string reason =
        gate(shape, dropout, direction, plans.version(), plans.compute_capability());
    return plans.plan(
        plan_key(direction, io, shape, dropout),
        [&] {
          if (!reason.empty()) common::fail("{}", reason);
          CudnnGraph graph = direction ? describe_backward(layout, io, probability)
                                       : describe_forward(layout, io, probability);
          graph.finalize(plans.version(), plans.handle());
          return graph;
        },
        caller_bytes);
  };
  const CudnnPlans::Lookup own = lookup(backward, regions.bytes);
  bool first_time = own.first_time;
  std::string refusal = own.refusal;
  if (own.plan != nullptr && dropout.active()) {
    // cuDNN's mask is its own: the other direction must run on cuDNN as well.
    const CudnnPlans::Lookup other =
        lookup(!backward, CallerRegions(layout, !backward, true, sizeof(Scalar)).bytes);
    first_time = first_time || other.first_time;
    if (other.plan == nullptr) {
      refusal = fmt::format(
          "with attention dropout both directions must run on cuDNN, and the {} "
          "does not: {}",
          backward ? "forward" : "backward", other.refusal);
    }
  }
  const bool runs = refusal.empty();
  planned.plan = runs ? own.plan : nullptr;
  planned.outcome = {
      .ran = runs,
      .refusal = refusal,
      .first_refusal = !runs && first_time,
      .built_plan = runs && own.first_time,
      .workspace_bytes = runs ? CudnnPlans::caller_offset(*own.plan) + regions.bytes : 0};
  if (runs) {
    planned.workspace = {
        static_cast<char*>(plans.workspace()) + CudnnPlans::caller_offset(*own.plan), regions};
  }
  return planned;
}

// The by-value scalars' host values (read when the plan is enqueued).
struct Scalars {
  float attn_scale, negative_infinity = -std::numeric_limits<float>::infinity();
  float keep_probability = 1.0f, drop_scale = 1.0f;  // 1 − p and 1/(1 − p)
  Scalars(const AttentionShape& shape, const Dropout& dropout, int64_t version)
      : attn_scale(1.0f / std::sqrt(static_cast<float>(shape.head_dim()))) {
    // Before cuDNN 9.10 the mask's fill is the lowest float, as the frontend does.
    if (version < 91000) negative_infinity = std::numeric_limits<float>::lowest();
    if (dropout.active()) {
      keep_probability = static_cast<float>(1.0 - dropout.probability);
      drop_scale = dropout.scale<float>();
    }
  }
};

// Appends the dropout's bindings (seed, offset, scale) after staging the RNG state.
void bind_dropout(std::vector<CudnnBinding>& bindings, const CallWorkspace& workspace,
                  const Dropout& dropout, Scalars& scalars, cudaStream_t stream) {
  if (!dropout.active()) return;
  auto* seed = workspace.at<int64_t>(workspace.regions.rng_state);
  auto* offset =
      workspace.at<int64_t>(workspace.regions.rng_state + CallerRegions::kRngStateStride);
  stage_dropout_state_kernel<<<1, 1, 0, stream>>>(seed, offset, dropout.stored_key, dropout.key);
  CUDA_CHECK(cudaGetLastError());
  bindings.push_back({kSeed, seed});
  bindings.push_back({kOffset, offset});
  bindings.push_back({kDropScale, &scalars.drop_scale});
}

}  // namespace

template <typename Scalar>
CudnnAttentionOutcome cudnn_attention_forward(const CudaContext& context, Scalar* output,
                                              float* logsumexp, const Scalar* qkv,
                                              const AttentionShape& shape, const Dropout& dropout) {
  const AttentionLayout layout(shape);
  const Planned planned = find_plan<Scalar>(context, shape, dropout, false);
  if (planned.plan == nullptr) return planned.outcome;
  const CallWorkspace& workspace = planned.workspace;
  const Scalar* queries = qkv;
  if (layout.queries_blocked) {
    auto* blocked = workspace.at<Scalar>(workspace.regions.blocked_queries);
    move_blocked_queries<false>(blocked, qkv, shape, context.stream);
    queries = blocked;
  }
  Scalars scalars(shape, dropout, context.cudnn_plans->version());
  auto* base = const_cast<Scalar*>(qkv);
  std::vector<CudnnBinding> bindings = {{kQ, const_cast<Scalar*>(queries)},
                                        {kKT, base + layout.k_offset},
                                        {kV, base + layout.v_offset},
                                        {kAttnScale, &scalars.attn_scale},
                                        {kNegativeInfinity, &scalars.negative_infinity},
                                        {kStats, logsumexp},
                                        {kO, output}};
  bind_dropout(bindings, workspace, dropout, scalars, context.stream);
  context.cudnn_plans->execute(*planned.plan, bindings);
  return planned.outcome;
}

template <typename Scalar>
CudnnAttentionOutcome cudnn_attention_backward(const CudaContext& context, Scalar* dqkv,
                                               const Scalar* doutput, const Scalar* qkv,
                                               const Scalar* output, const float* logsumexp,
                                               const AttentionShape& shape,
                                               const Dropout& dropout) {
  const AttentionLayout layout(shape);
  const Planned planned = find_plan<Scalar>(context, shape, dropout, true);
  if (planned.plan == nullptr) return planned.outcome;
  const CallWorkspace& workspace = planned.workspace;
  const Scalar* queries = qkv;
  Scalar* query_gradients = dqkv;
  if (layout.queries_blocked) {
    auto* blocked_queries = workspace.at<Scalar>(workspace.regions.blocked_queries);
    query_gradients = workspace.at<Scalar>(workspace.regions.blocked_query_gradients);
    move_blocked_queries<false>(blocked_queries, qkv, shape, context.stream);
    queries = blocked_queries;
  }
  Scalars scalars(shape, dropout, context.cudnn_plans->version());
  auto* base = const_cast<Scalar*>(qkv);
  std::vector<CudnnBinding> bindings = {
      {kQ, const_cast<Scalar*>(queries)},
      {kKT, base + layout.k_offset},
      {kVT, base + layout.v_offset},
      {kO, const_cast<Scalar*>(output)},
      {kDO, const_cast<Scalar*>(doutput)},
      {kStats, const_cast<float*>(logsumexp)},
      {kAttnScale, &scalars.attn_scale},
      {kNegativeInfinity, &scalars.negative_infinity},
      {kKeepProbability, &scalars.keep_probability},
      {kSoftmaxSum, workspace.at<float>(workspace.regions.softmax_sum)},
      {kDV, dqkv + layout.v_offset},
      {kDK, dqkv + layout.k_offset},
      {kDQ, query_gradients}};
  bind_dropout(bindings, workspace, dropout, scalars, context.stream);
  context.cudnn_plans->execute(*planned.plan, bindings);
  if (layout.queries_blocked) {
    move_blocked_queries<true>(query_gradients, dqkv, shape, context.stream);
  }
  return planned.outcome;
}

CudnnAttentionGraphs cudnn_attention_graph_check(const AttentionShape& shape, ElementType io_type,
                                                 double attention_dropout) {
  check_attention_shape(shape, "cudnn_attention_graph_check");
  if (io_type != ElementType::bf16 && io_type != ElementType::f16) {
    common::fail(
        "cudnn_attention_graph_check: cuDNN's fused attention takes bf16 or fp16, not "
        "{}",
        element_name(io_type));
  }
  const cudnnDataType_t io = io_type == ElementType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const int64_t version = static_cast<int64_t>(cuda_detail::cudnn().get_version());
  if (version < 90800) {
    common::fail(
        "cudnn_attention_graph_check: cuDNN {} needs a handle (a GPU) to finalize a "
        "graph; 9.8 or later does without",
        version);
  }
  const AttentionLayout layout(shape);
  if (!(attention_dropout >= 0 && attention_dropout < 1)) {
    common::fail("cudnn_attention_graph_check: attention dropout {} is not in [0, 1)",
                 attention_dropout);
  }
  CudnnGraph forward = describe_forward(layout, io, attention_dropout);
  forward.finalize(version, nullptr);
  CudnnGraph backward = describe_backward(layout, io, attention_dropout);
  backward.finalize(version, nullptr);
  return {.cudnn_version = version,
          .forward_operations = static_cast<int64_t>(forward.operation_count()),
          .backward_operations = static_cast<int64_t>(backward.operation_count()),
          .external_tensors = static_cast<int64_t>(forward.external_uids().size() +
                                                   backward.external_uids().size())};
}

#define BACKEND_INSTANTIATE_CUDNN_ATTENTION(Scalar)                                               \
  template CudnnAttentionOutcome cudnn_attention_forward<Scalar>(                                 \
      const CudaContext&, Scalar*, float*, const Scalar*, const AttentionShape&, const Dropout&); \
  template CudnnAttentionOutcome cudnn_attention_backward<Scalar>(                                \
      const CudaContext&, Scalar*, const Scalar*, const Scalar*, const Scalar*, const float*,     \
      const AttentionShape&, const Dropout&);
BACKEND_INSTANTIATE_CUDNN_ATTENTION(bfloat16)
BACKEND_INSTANTIATE_CUDNN_ATTENTION(float16)
#undef BACKEND_INSTANTIATE_CUDNN_ATTENTION

}  // namespace backend::cuda
