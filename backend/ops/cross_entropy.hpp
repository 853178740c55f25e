// Softmax + cross-entropy over the (padded) vocabulary, fused (Megatron core's
// vocab_parallel_cross_entropy with tensor parallel size 1; llm.c's fused classifier):
//   logsumexp_i = log Σ_v exp(logits[i, v])        (computed as m + log Σ exp(logits − m))
//   loss_i      = logsumexp_i − logits[i, label_i]
// The forward writes one loss per row (the caller takes the mean, in a fixed order) and keeps
// logsumexp_i, so the backward recomputes the softmax from the logits instead of storing a
// second (N, V) array of probabilities:
//   dlogits[i, v] = (exp(logits[i, v] − logsumexp_i) − [v == label_i]) · scale
// With scale = 1/N this is the gradient of the mean loss. Padded vocabulary entries take part
// in the softmax like any other, as in Megatron.
// Contract: no parameters; dlogits is overwritten (=) and may alias logits (in place).
// Labels are trusted to lie in [0, V) (GptModel validates them before calling).
// Dimensions: N rows (B·T), V vocabulary (padded).
#pragma once

#include <cstdint>

#include "backend/device/cuda_stream.hpp"
#include "backend/device/element_type.hpp"

namespace backend::cpu {

template <typename Scalar>
void cross_entropy_forward(Scalar* losses,         // (N)
                           Scalar* logsumexp,      // (N)
                           const Scalar* logits,   // (N, V)
                           const int32_t* labels,  // (N)
                           int64_t rows, int64_t vocab_size);

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits,          // (N, V) =, may alias logits
                            const Scalar* logits,     // (N, V)
                            const Scalar* logsumexp,  // (N) from the forward
                            const int32_t* labels,    // (N)
                            Scalar scale, int64_t rows, int64_t vocab_size);

}  // namespace backend::cpu

// The CUDA twin (cross_entropy_cuda.cu), logits float or bfloat16, computed in float; losses
// and logsumexp are float whatever Scalar is, as is scale. One block per row with fixed-order
// reductions (max, then Σ exp(z − max)), so a run repeats its bits. dlogits may alias logits.
namespace backend::cuda {

template <typename Scalar>
void cross_entropy_forward(float* losses,          // (N)
                           float* logsumexp,       // (N)
                           const Scalar* logits,   // (N, V)
                           const int32_t* labels,  // (N)
                           int64_t rows, int64_t vocab_size, CudaStream stream);

template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits,         // (N, V) =, may alias logits
                            const Scalar* logits,    // (N, V)
                            const float* logsumexp,  // (N) from the forward
                            const int32_t* labels,   // (N)
                            float scale, int64_t rows, int64_t vocab_size, CudaStream stream);

}  // namespace backend::cuda
