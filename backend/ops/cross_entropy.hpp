// Softmax + cross-entropy over the (padded) vocabulary, fused (Megatron core's
// vocab_parallel_cross_entropy; llm.c's fused classifier):
//   logsumexp_i = log Σ_v exp(logits[i, v])        (computed as m + log Σ exp(logits − m))
//   loss_i      = logsumexp_i − logits[i, label_i]
// The forward writes one loss per row (the caller takes the mean, in a fixed order) and keeps
// logsumexp_i, so the backward recomputes the softmax from the logits instead of storing a
// second (N, V) array of probabilities:
//   dlogits[i, v] = (exp(logits[i, v] − logsumexp_i) − [v + vocab_start == label_i]) · scale
// With scale = 1/N this is the gradient of the mean loss. Padded vocabulary entries take part
// in the softmax like any other, as in Megatron.
//
// Vocabulary parallel (tensor parallelism, Megatron's vocab_parallel_cross_entropy): a rank
// holds the logits of vocabulary columns [vocab_start, vocab_start + V) only. Its forward is
//   partial: logsumexp_part_i = log Σ_{v in the shard} exp(logits[i, v])   (stably, as above)
//            target_logit_i   = logits[i, label_i − vocab_start] if the shard holds label_i,
//                               else 0
// then the caller all-gathers the parts' logsumexp_part into (P, N) (part-major) and sums
// target_logit over the parts (one rank holds each label, the others add 0), and
//   combine:  logsumexp_i = M_i + log Σ_k exp(parts[k, i] − M_i),  M_i = max_k parts[k, i]
//             loss_i      = logsumexp_i − target_logit_i
// (k in order 0..P−1: every rank computes the same bits). Megatron all-reduces the max and
// Σ exp instead; a log-sum-exp per shard is one value per row as well and keeps each shard's
// exponentials shifted by its own maximum. With P = 1 the combine is the forward bit for bit
// (exp(0) = 1, log 1 = 0). The backward of a shard is the formula above with the global
// logsumexp_i: it needs no communication.
// Ignored positions (Megatron's loss mask of 0, --eod-mask-loss; PyTorch's ignore_index): a
// negative label (GptModel passes kIgnoredLabel only) gives loss_i = 0 and a zero row of dlogits,
// in every twin and every shard; the caller divides by the count of the other labels instead
// of N. logsumexp_i is computed for such rows as for any other.
// The fused classifier (llm.c's fused_classifier; training, where the backward's scale is known
// when the forward runs): cross_entropy_forward_backward computes the loss and logsumexp and
// then overwrites the logits with dlogits, in one pass over each row, unsharded only. Its bits
// are the separate forward's and backward's on the CPU; the CUDA twin reads each row once for
// an online softmax (a running maximum and a sum rescaled when the maximum grows, per thread,
// then combined over the block) and once more to write the gradient, where the separate ops
// read it three times in two launches. Its scale may be given in device memory instead, read
// when the op runs: a captured step (docs/step_on_device.md) replays the op with the capture's
// arguments, while each micro batch's scale depends on its count of scored labels.
// Contract: no parameters; dlogits is overwritten (=) and may alias logits (in place).
// Labels are ids of the whole vocabulary or negative; the unsharded forward trusts the others
// to lie in [0, V) (GptModel validates them before calling).
// Dimensions: N rows (B·T), V vocabulary (padded; the shard's columns when sharded), P parts.
#pragma once

#include <cstdint>

#include "backend/common/error.hpp"
#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend {

// The label of a position whose loss is left out: PyTorch's default ignore_index, so a batch
// written for torch.nn.functional.cross_entropy means the same here.
inline constexpr int32_t kIgnoredLabel = -100;

// Both devices' check of the vocab-parallel combine's input: `parts` (≥ 1) log-sum-exps per
// row, (parts, rows) of them in `numel` elements.
inline void check_logsumexp_parts(int64_t numel, int64_t rows, int64_t parts, const char* op) {
  if (parts < 1 || numel != parts * rows) {
    common::fail("{}: {} parts of {} rows need {} log-sum-exps, got {}", op, parts, rows,
                 parts * rows, numel);
  }
}

}  // namespace backend

namespace backend::cpu {

template <typename Scalar>
void cross_entropy_forward(Scalar* losses,         // (N)
                           Scalar* logsumexp,      // (N)
                           const Scalar* logits,   // (N, V)
                           const int32_t* labels,  // (N)
                           int64_t rows, int64_t vocab_size);

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits,          // (N, V) =, may alias logits
                            const Scalar* logits,     // (N, V) columns vocab_start + [0, V)
                            const Scalar* logsumexp,  // (N) of the whole vocabulary
                            const int32_t* labels,    // (N)
                            Scalar scale, int64_t rows, int64_t vocab_size, int64_t vocab_start);

template <typename Scalar>
void cross_entropy_forward_backward(Scalar* losses,         // (N)
                                    Scalar* logsumexp,      // (N)
                                    Scalar* logits,         // (N, V) in, dlogits out
                                    const int32_t* labels,  // (N)
                                    Scalar scale, int64_t rows, int64_t vocab_size);

template <typename Scalar>
void vocab_parallel_cross_entropy_partial(Scalar* logsumexp_part,  // (N) over the shard
                                          Scalar* target_logit,    // (N), 0 off the shard
                                          const Scalar* logits,    // (N, V) the shard's columns
                                          const int32_t* labels,   // (N)
                                          int64_t rows, int64_t vocab_size, int64_t vocab_start);

template <typename Scalar>
void vocab_parallel_cross_entropy_combine(Scalar* losses,                 // (N)
                                          Scalar* logsumexp,              // (N)
                                          const Scalar* logsumexp_parts,  // (P, N)
                                          const Scalar* target_logit,     // (N) summed
                                          const int32_t* labels,          // (N)
                                          int64_t rows, int64_t parts);

}  // namespace backend::cpu

// The CUDA twin (cross_entropy_cuda.cu), logits float, bfloat16 or float16, computed in float;
// losses, logsumexp, its parts and the target logits are float whatever Scalar is, as is scale. One
// block per row with fixed-order reductions (max, then Σ exp(z − max)), so a run repeats its bits;
// the combine is one thread per row. dlogits may alias logits.
namespace backend::cuda {

template <typename Scalar>
void cross_entropy_forward(float* losses,          // (N)
                           float* logsumexp,       // (N)
                           const Scalar* logits,   // (N, V)
                           const int32_t* labels,  // (N)
                           int64_t rows, int64_t vocab_size, CudaStream stream);

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits,         // (N, V) =, may alias logits
                            const Scalar* logits,    // (N, V) columns vocab_start + [0, V)
                            const float* logsumexp,  // (N) of the whole vocabulary
                            const int32_t* labels,   // (N)
                            float scale,
                            const double* stored_scale,  // replaces scale when not null
                            int64_t rows, int64_t vocab_size, int64_t vocab_start,
                            CudaStream stream);

template <typename Scalar>
void cross_entropy_forward_backward(float* losses,          // (N)
                                    float* logsumexp,       // (N)
                                    Scalar* logits,         // (N, V) in, dlogits out
                                    const int32_t* labels,  // (N)
                                    float scale,
                                    const double* stored_scale,  // replaces scale when not null
                                    int64_t rows, int64_t vocab_size, CudaStream stream);

template <typename Scalar>
void vocab_parallel_cross_entropy_partial(float* logsumexp_part,  // (N) over the shard
                                          float* target_logit,    // (N), 0 off the shard
                                          const Scalar* logits,   // (N, V) the shard's columns
                                          const int32_t* labels,  // (N)
                                          int64_t rows, int64_t vocab_size, int64_t vocab_start,
                                          CudaStream stream);

void vocab_parallel_cross_entropy_combine(float* losses,                 // (N)
                                          float* logsumexp,              // (N)
                                          const float* logsumexp_parts,  // (P, N)
                                          const float* target_logit,     // (N) summed
                                          const int32_t* labels,         // (N)
                                          int64_t rows, int64_t parts, CudaStream stream);

}  // namespace backend::cuda

// The ops on `device`'s memory: fp32 or fp64 on the CPU (losses and log-sum-exps of the logits'
// type); logits fp32, bf16 or fp16 on a GPU, losses, log-sum-exps and target logits fp32. The
// backward's logits are the vocabulary columns [vocab_start, vocab_start + vocab_size) and
// logsumexp the whole vocabulary's (vocab_start 0: the unsharded op). The vocabulary-parallel
// forward: each shard's partial, an all-gather of the partials and a sum of the target logits
// by the caller, then the combine.
namespace backend::ops {

void cross_entropy_forward(Device& device, View losses, View logsumexp, View logits,
                           View labels, int64_t rows, int64_t vocab_size);
// With `stored_scale` (one f64 in the device's memory) the scale is read from there when the op
// runs, rounded as `scale` would be (a captured step's scale, staged before each replay).
void cross_entropy_backward(Device& device, View dlogits, View logits, View logsumexp, View labels,
                            double scale, int64_t rows, int64_t vocab_size, int64_t vocab_start,
                            View stored_scale = {});
// The fused classifier: the forward's losses and logsumexp, and `logits` overwritten by the
// backward's dlogits (the whole vocabulary, vocab_start 0). `stored_scale` as the backward's.
void cross_entropy_forward_backward(Device& device, View losses, View logsumexp, View logits,
                                    View labels, double scale, int64_t rows, int64_t vocab_size,
                                    View stored_scale = {});
void vocab_parallel_cross_entropy_partial(Device& device, View logsumexp_part,
                                          View target_logit, View logits, View labels,
                                          int64_t rows, int64_t vocab_size,
                                          int64_t vocab_start);
void vocab_parallel_cross_entropy_combine(Device& device, View losses, View logsumexp,
                                          View logsumexp_parts, View target_logit, View labels,
                                          int64_t rows, int64_t parts);

}  // namespace backend::ops
