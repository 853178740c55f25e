// Fully connected layer as torch.nn.Linear and Megatron's ColumnParallelLinear /
// RowParallelLinear store it (weight is (out, in)); llm.c's matmul_*:
//   y = x · W^T + b
// Backward:
//   dx  = dy · W                  (overwrites)
//   dW += dy^T · x
//   db += Σ_rows dy
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// The products run through OpenBLAS (sgemm / dgemm) in fixed tiles, the bias sum is a
// per-column loop: neither depends on the thread count.
// Optional pieces: bias and dbias may be nullptr (no bias, e.g. the output layer tied to the
// word embedding), dinput may be nullptr when the input needs no gradient. Their types do
// not take part in deducing Scalar, so a plain nullptr is accepted.
// Dimensions: N rows (B·T), IN input features, OUT output features.
#pragma once

#include <cstdint>
#include <type_traits>

namespace backend::cpu {

template <typename Scalar>
void linear_forward(Scalar* output,                            // (N, OUT)
                    const Scalar* input,                       // (N, IN)
                    const Scalar* weight,                      // (OUT, IN)
                    const std::type_identity_t<Scalar>* bias,  // (OUT) or nullptr
                    int64_t rows, int64_t in_features, int64_t out_features);

template <typename Scalar>
void linear_backward(std::type_identity_t<Scalar>* dinput,  // (N, IN)   =, or nullptr to skip
                     Scalar* dweight,                       // (OUT, IN) +=
                     std::type_identity_t<Scalar>* dbias,   // (OUT) +=, or nullptr if no bias
                     const Scalar* doutput,                 // (N, OUT)
                     const Scalar* input,                   // (N, IN)
                     const Scalar* weight,                  // (OUT, IN)
                     int64_t rows, int64_t in_features, int64_t out_features);

}  // namespace backend::cpu
