// Causal self-attention core with grouped-query attention (the part between linear_qkv and
// linear_proj: Megatron core's DotProductAttention with the causal mask and its attention
// dropout; Vaswani et al. 2017; GQA: Ainslie et al. 2023), computed blockwise as
// FlashAttention-2 does (Dao 2023, Algorithms 1 and 2), so that no (T, T) array is ever held.
//
// Layout (Megatron core's SelfAttention.get_query_key_value_tensors): the qkv row of a position
// holds NG query groups, each [q of its NH/NG heads (HD each) | k (HD) | v (HD)], so
//   group g = h / (NH/NG) of head h starts at column g·(NH/NG + 2)·HD,
//   head h's query is (h mod NH/NG)·HD further, the group's key NH/NG·HD further, its value HD
//   after the key.
// NG = NH is multi-head attention (per head [q | k | v], the layout GPT models use), NG = 1
// multi-query attention. The output row is the NH heads' HD columns, concatenated.
//
// Per batch b and head h, with Q the head's (T, HD) queries and K, V its group's keys, values:
//   S = Q · K^T / sqrt(HD),   P = softmax over j ≤ i of S[i, j] (P[i, j] = 0 for j > i)
//   D = dropout(P)   (dropout.hpp; element (b, h, i, j) is index ((b·NH + h)·T + i)·T + j of
//                     the mask; D = P when the dropout is inactive, the default)
//   O = D · V
// The forward keeps only O and the row log-sum-exp L[i] = log Σ_{j≤i} exp(S[i, j]) (B, NH, T):
// memory linear in T. It runs over blocks of query rows; for each, over the key blocks at or
// below the diagonal with an online softmax (running row maximum m and sum l, the partial O
// rescaled by exp(m_old − m_new) when m grows), dividing by l at the end.
// Backward, with dO the output gradient (FA2 Algorithm 2), per query/key block pair at or
// below the diagonal:
//   P = exp(S − L) (recomputed),  Δ[i] = Σ_d dO[i, d] · O[i, d]  (= Σ_j P[i, j] · dP[i, j])
//   dV += D^T · dO,   dP = dropout_backward(dO · V^T) (the same mask and scale)
//   dS = P ∘ (dP − Δ),   dQ += dS · K / sqrt(HD),   dK += dS^T · Q / sqrt(HD)
// Keys and values of a group collect the gradients of all of its heads.
// The backward must get the forward's dropout, output and log-sum-exp. The mask is the
// (B, NH, T, T) probabilities' own, so a Dropout::first_index (an offset into a larger
// tensor's mask, for sequence-parallel slices of activations) is refused, not ignored.
// Contract: there are no parameters; the activation gradient dqkv is overwritten (=).
// Results do not depend on the thread count: the forward's unit of work is one (b, h, query
// block), the backward's one (b, group), which sums its dK, dV (and dQ) in a fixed order.
// Dimensions: B batch, T sequence, NH heads, NG query groups (NH % NG == 0), HD head dimension,
// C hidden = NH · HD.
#pragma once

#include <cstdint>
#include <string>

#include "backend/common/error.hpp"
#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"
#include "backend/ops/dropout.hpp"

namespace backend {

// One call's dimensions (B, T, C, NH, NG above), the same for every twin and both directions.
struct AttentionShape {
  int64_t batch_size = 0;
  int64_t seq_length = 0;
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_query_groups = 0;

  // Meaningful once check_attention_shape has passed.
  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t heads_per_group() const { return num_heads / num_query_groups; }
  int64_t qkv_row_width() const { return (num_heads + 2 * num_query_groups) * head_dim(); }
  // Nothing to compute (the twins return after their checks).
  bool empty() const { return batch_size <= 0 || seq_length <= 0; }
};

// Every twin's first check: common::Error naming `op` unless the heads divide the hidden size
// and the query groups divide the heads.
inline void check_attention_shape(const AttentionShape& shape, const char* op) {
  if (shape.num_heads <= 0 || shape.hidden_size % shape.num_heads != 0) {
    common::fail("{}: {} heads must divide the hidden size {}", op, shape.num_heads,
                 shape.hidden_size);
  }
  if (shape.num_query_groups <= 0 || shape.num_heads % shape.num_query_groups != 0) {
    common::fail("{}: {} query groups must divide the {} heads", op, shape.num_query_groups,
                 shape.num_heads);
  }
}

// Both twins' check (the CUDA one in CudaDevice, before the launch): common::Error for a
// dropout with a mask offset, which attention's own mask index has no place for.
inline void check_attention_dropout(const Dropout& dropout, const char* op) {
  if (dropout.first_index != 0) {
    common::fail("{}: attention's dropout draws the mask of its own (batch, heads, T, T) "
                 "probabilities and takes no first_index (got {}); first_index offsets "
                 "dropout_forward/dropout_backward on a slice of a larger tensor",
                 op, dropout.first_index);
  }
}

}  // namespace backend

namespace backend::cpu {

// Rows of one block of queries and of keys. Any positive sizes give the same result up to
// rounding; the defaults are tuned for the CPU (a score block is a few OpenBLAS tiles).
struct AttentionBlocks {
  int64_t query_rows = 64;
  int64_t key_rows = 64;
};

// Scalars of scratch one thread of attention_forward or attention_backward uses (a score
// block's worth per kind, the group's Δ rows).
int64_t attention_scratch_per_thread(int64_t seq_length, int64_t heads_per_group,
                                     const AttentionBlocks& blocks = {});

// `scratch`: omp_get_max_threads() × attention_scratch_per_thread Scalars that the caller
// carved once (the CPU device's, so that a training step allocates nothing); nullptr: each
// thread allocates its own for the call.
template <typename Scalar>
void attention_forward(Scalar* output,     // (B, T, C)
                       Scalar* logsumexp,  // (B, NH, T)
                       const Scalar* qkv,  // (B, T, (NH + 2·NG)·HD) per group [q… | k | v]
                       const AttentionShape& shape, const Dropout& dropout = {},
                       const AttentionBlocks& blocks = {}, Scalar* scratch = nullptr);

template <typename Scalar>
void attention_backward(Scalar* dqkv,             // (B, T, (NH + 2·NG)·HD) =
                        const Scalar* doutput,    // (B, T, C)
                        const Scalar* qkv,        // (B, T, (NH + 2·NG)·HD)
                        const Scalar* output,     // (B, T, C) from the forward
                        const Scalar* logsumexp,  // (B, NH, T) from the forward
                        const AttentionShape& shape, const Dropout& dropout = {},  // the forward's
                        const AttentionBlocks& blocks = {}, Scalar* scratch = nullptr);

// ---- Attention over a key/value cache (incremental decoding, model/gpt_decoder.hpp)
// N packed rows, row r one token of the sequence whose cache is slot slots[r], at position
// positions[r]; qkv is the rows' linear_qkv output in the layout above (RoPE already applied).
// One layer's caches hold (S slots, L positions, NG groups, HD) keys and values each, so a
// slot's keys are contiguous per position. The op first stores every row's keys and values:
//   key_cache[slots[r], positions[r], g] = k of group g,  value_cache[…] = v of group g
// and then, for every row and head h of group g = h / (NH/NG), with p = positions[r]:
//   s_j = q_h · key_cache[slots[r], j, g] / sqrt(HD)      j = 0..p
//   output[r, h] = Σ_j softmax(s)_j · value_cache[slots[r], j, g]
// which is attention_forward's causal row at position p when the slot holds that sequence's
// keys and values at 0..p−1. Storing every row first lets the rows of one slot at consecutive
// positions (a prompt's prefill) see each other causally. No dropout (inference) and no
// log-sum-exp (no backward). The caller guarantees slots < S, positions < L, that positions
// 0..p−1 of the slot are filled, and at most one row per (slot, position).
// Contract: output (N, NH·HD) overwritten; the caches written at the rows' places only. Each
// (row, head) is one unit of work summing its keys in position order, so the result does not
// depend on the thread count.
template <typename Scalar>
void kv_cache_attention_forward(Scalar* output,            // (N, NH·HD)
                                Scalar* key_cache,         // (S, L, NG, HD)
                                Scalar* value_cache,       // (S, L, NG, HD)
                                const Scalar* qkv,         // (N, (NH + 2·NG)·HD)
                                const int32_t* slots,      // (N)
                                const int32_t* positions,  // (N)
                                int64_t rows, int64_t num_heads, int64_t num_query_groups,
                                int64_t head_dim, int64_t max_length);

}  // namespace backend::cpu

// CUDA twin (attention_cuda.cu): the same blockwise algorithm on CUDA cores in fp32 (a bf16 or
// fp16 qkv is read and written as such, computed in fp32); the log-sum-exp is fp32 whatever the
// qkv type. Head dimensions up to 128. No scratch: the backward's dK, dV of a (b, group, key
// block) are summed by one thread block over the group's heads and query blocks in a fixed
// order, and each (b, h, query block)'s dQ by another over the key blocks, so the results are
// the same bits run after run (no atomics).
namespace backend::cuda {

inline constexpr int64_t kAttentionMaxHeadDim = 128;

template <typename Scalar>                 // float, bfloat16 or float16
void attention_forward(Scalar* output,     // (B, T, C)
                       float* logsumexp,   // (B, NH, T)
                       const Scalar* qkv,  // (B, T, (NH + 2·NG)·HD) per group [q… | k | v]
                       const AttentionShape& shape, const Dropout& dropout, CudaStream stream);

template <typename Scalar>                       // float, bfloat16 or float16
void attention_backward(Scalar* dqkv,            // (B, T, (NH + 2·NG)·HD) =
                        const Scalar* doutput,   // (B, T, C)
                        const Scalar* qkv,       // (B, T, (NH + 2·NG)·HD)
                        const Scalar* output,    // (B, T, C) from the forward
                        const float* logsumexp,  // (B, NH, T) from the forward
                        const AttentionShape& shape, const Dropout& dropout, CudaStream stream);

// The same forward and backward on tensor cores (attention_flash_cuda.cu): bf16 or fp16, head
// dimensions 64 and 128 (flash_attention_supports), 16-byte aligned rows. mma.sync products of
// the qkv's 16-bit type with fp32 accumulators, so the results differ from
// attention_forward/attention_backward by rounding (P and dS enter their products in that
// type); the same determinism (no atomics). The CUDA device runs it for bf16 and fp16 under
// --attention-backend flash (or --use-flash-attn), and under auto where cuDNN does not run the
// call, when the head dimension fits; attention_forward otherwise. common::Error for another head
// dimension or a misaligned pointer.
constexpr bool flash_attention_supports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

template <typename Scalar>                       // bfloat16 or float16
void flash_attention_forward(Scalar* output,     // (B, T, C)
                             float* logsumexp,   // (B, NH, T)
                             const Scalar* qkv,  // (B, T, (NH + 2·NG)·HD)
                             const AttentionShape& shape, const Dropout& dropout,
                             CudaStream stream);

template <typename Scalar>                             // bfloat16 or float16
void flash_attention_backward(Scalar* dqkv,            // (B, T, (NH + 2·NG)·HD) =
                              const Scalar* doutput,   // (B, T, C)
                              const Scalar* qkv,       // (B, T, (NH + 2·NG)·HD)
                              const Scalar* output,    // (B, T, C) from the forward
                              const float* logsumexp,  // (B, NH, T) from the forward
                              const AttentionShape& shape, const Dropout& dropout,
                              CudaStream stream);

// The same forward and backward through cuDNN's fused flash attention
// (attention_cudnn_cuda.cu; docs/cudnn_attention.md), where the device has cuDNN plans
// (CudaContext::cudnn_plans) and cuDNN runs the call: bf16 or fp16, compute capability 8.0+,
// head dimensions that are multiples of 8 up to 128 (256 on sm90), cuDNN 9 but not
// 9.10.0-9.10.1, and for the backward before cuDNN 9.15.1 a sequence length that is a multiple
// of 128. Attention dropout draws cuDNN's own mask (Philox, seeded by the Dropout's key, read
// from its stored_key where there is one), not the CPU twin's: the same key gives the same mask
// in the forward and the backward, run after run, and a call with dropout runs on cuDNN only
// where both directions do (not on cuDNN 9.11.1-9.13.x). One plan per shape and dropout
// probability, built the first time. The backward is cuDNN's deterministic form (no fp32 dQ
// accumulator summed in any order), so a run repeats its bits. Megatron's grouped qkv row is
// read in place for multi-head and multi-query attention; grouped-query attention gathers the
// queries into blocked order first. cuDNN's workspace, the dropout's seed and offset,
// softmax_sum (backward) and the blocked queries live in the device's cuDNN workspace
// (device/cudnn_graph.cuh), grown when a shape's plan is built. Not ran: `refusal` says why
// (first_refusal: the first call of this shape refused on this device) and nothing was done. A
// failure while executing a plan is a common::Error.
struct CudnnAttentionOutcome {
  bool ran = false;
  std::string refusal;
  bool first_refusal = false;
  bool built_plan = false;      // ran, on a plan this call built
  int64_t workspace_bytes = 0;  // ran: the workspace the call used
};

template <typename Scalar>  // bfloat16 or float16
CudnnAttentionOutcome cudnn_attention_forward(const CudaContext& context,
                                              Scalar* output,     // (B, T, C)
                                              float* logsumexp,   // (B, NH, T)
                                              const Scalar* qkv,  // (B, T, (NH + 2·NG)·HD)
                                              const AttentionShape& shape, const Dropout& dropout);

template <typename Scalar>  // bfloat16 or float16
CudnnAttentionOutcome cudnn_attention_backward(const CudaContext& context,
                                               Scalar* dqkv,            // (B, T, W) =
                                               const Scalar* doutput,   // (B, T, C)
                                               const Scalar* qkv,       // (B, T, W)
                                               const Scalar* output,    // (B, T, C)
                                               const float* logsumexp,  // (B, NH, T)
                                               const AttentionShape& shape, const Dropout& dropout);

// CI's check of the graphs without a GPU: the forward and backward graphs of `shape` (with
// `attention_dropout` p > 0, the dropout operations too) described and finalized by the cuDNN this
// process loads (cuDNN 9.8+ finalizes an operation graph without a handle; the engines' acceptance
// needs a GPU). common::Error with cuDNN's reason when it refuses one, or when the build has no
// cuDNN.
struct CudnnAttentionGraphs {
  int64_t cudnn_version = 0;
  int64_t forward_operations = 0;
  int64_t backward_operations = 0;
  int64_t external_tensors = 0;  // both graphs'
};
CudnnAttentionGraphs cudnn_attention_graph_check(const AttentionShape& shape, ElementType io_type,
                                                 double attention_dropout = 0);

// The CPU twin's contract; head dimensions up to kAttentionMaxHeadDim. One kernel stores the
// rows' keys and values (a thread per element), a second attends: one warp per (row, head),
// lanes over the head's features, an online softmax over the slot's positions in order (the
// score a fixed butterfly warp sum), so the results are the same bits run after run.
template <typename Scalar>  // float, bfloat16 or float16
void kv_cache_attention_forward(Scalar* output, Scalar* key_cache, Scalar* value_cache,
                                const Scalar* qkv, const int32_t* slots,
                                const int32_t* positions, int64_t rows, int64_t num_heads,
                                int64_t num_query_groups, int64_t head_dim, int64_t max_length,
                                CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory. On the CPU: fp32 or fp64, the blocks' per-thread memory from
// the device's scratch. On a GPU: fp32, bf16 or fp16 (logsumexp fp32), on the kernels the
// device's attention backend picks (CudaContext::attention_backend, cuda_context.hpp): cuDNN
// (fused; auto where cuDNN runs the call), the tensor-core kernels (flash; auto's fallback) for
// bf16 and fp16 where the head dimension fits, the CUDA-core kernels otherwise. auto's
// fallback is logged once per reason; fused's refusal is a common::Error naming it. The device's
// observer is told causal attention's floating-point operations: 2·B·T²·C forward (Q·Kᵀ and P·V
// over the lower triangle), 2.5 times that backward. kv_cache_attention_forward is incremental
// decoding's (above).
namespace backend::ops {

void attention_forward(Device& device, View output, View logsumexp, View qkv,
                       const AttentionShape& shape, const Dropout& dropout);
void attention_backward(Device& device, View dqkv, View doutput, View qkv, View output,
                        View logsumexp, const AttentionShape& shape, const Dropout& dropout);
void kv_cache_attention_forward(Device& device, View output, View key_cache, View value_cache,
                                View qkv, View slots, View positions, int64_t rows,
                                int64_t num_heads, int64_t num_query_groups, int64_t head_dim,
                                int64_t max_length);

}  // namespace backend::ops
