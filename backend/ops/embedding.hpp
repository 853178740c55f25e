// Token + learned position embedding at the bottom of a GPT decoder (Megatron core's
// LanguageModelEmbedding without dropout; GPT-2's wte + wpe; llm.c's encoder_forward):
//   output[b, t, :] = word_embeddings[tokens[b, t], :] + position_embeddings[t, :]
// Backward scatters the output gradient into both tables:
//   dword_embeddings[tokens[b, t], :] += doutput[b, t, :]
//   dposition_embeddings[t, :]        += Σ_b doutput[b, t, :]
// With rotary positions (--position-embedding-type rope) there is no position table:
// position_embeddings and dposition_embeddings are then nullptr and only the word row is used.
// Contract: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Tokens are trusted to lie in [0, V) (GptModel validates them before calling), and the
// position table has at least T rows. Repeated tokens are summed in (b, t) order, so the
// result does not depend on the thread count.
// Dimensions: B batch, T sequence, C hidden, V rows of the word table.
#pragma once

#include <cstdint>

namespace backend::cpu {

template <typename Scalar>
void embedding_forward(Scalar* output,                     // (B, T, C)
                       const int32_t* tokens,              // (B, T)
                       const Scalar* word_embeddings,      // (V, C)
                       const Scalar* position_embeddings,  // (≥ T, C) or nullptr
                       int64_t batch_size, int64_t seq_length, int64_t hidden_size);

template <typename Scalar>
void embedding_backward(Scalar* dword_embeddings,      // (V, C)   +=
                        Scalar* dposition_embeddings,  // (≥ T, C) +=, or nullptr
                        const Scalar* doutput,         // (B, T, C)
                        const int32_t* tokens,         // (B, T)
                        int64_t batch_size, int64_t seq_length, int64_t hidden_size);

}  // namespace backend::cpu
