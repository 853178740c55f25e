// Causal multi-head self-attention core (the part between linear_qkv and linear_proj:
// Megatron core's DotProductAttention with the causal mask and its attention dropout;
// Vaswani et al. 2017; llm.c's attention_*). It reads the fused qkv activation in Megatron's
// layout: the 3C columns of a position are NH groups of [q | k | v], each HD wide, so head h's
// query is columns h·3HD + [0, HD), its key h·3HD + HD + [0, HD), its value h·3HD + 2HD + [0, HD).
// Per batch b and head h, with Q, K, V the (T, HD) slices:
//   S = Q · K^T / sqrt(HD),   P = softmax over j ≤ i of S[i, j] (P[i, j] = 0 for j > i)
//   D = dropout(P)   (dropout.hpp; element (b, h, i, j) is index ((b·NH + h)·T + i)·T + j of
//                     the mask; D = P when the dropout is inactive, the default)
//   O = D · V,   written to output columns h·HD + [0, HD) (heads concatenated, as Megatron)
// Backward, with dO the output gradient slice:
//   dV = D^T · dO,   dD = dO · V^T,   dP = dropout_backward(dD) (the same mask and scale)
//   dS[i, j] = P[i, j] · (dP[i, j] − Σ_k P[i, k] dP[i, k])
//   dQ = dS · K / sqrt(HD),   dK = dS^T · Q / sqrt(HD)
// The forward keeps the probabilities P, before dropout, for the backward (B·NH·T² scalars);
// D is regenerated from P and the mask's key, so the backward must get the forward's dropout.
// Contract: there are no parameters; the activation gradient dqkv is overwritten (=).
// Each (b, h) pair is computed by one thread with OpenBLAS GEMMs, so results do not depend on
// the thread count.
// Dimensions: B batch, T sequence, C hidden = NH · HD, NH heads, HD head dimension.
#pragma once

#include <cstdint>

#include "backend/ops/dropout.hpp"

namespace backend::cpu {

template <typename Scalar>
void attention_forward(Scalar* output,         // (B, T, C)
                       Scalar* probabilities,  // (B, NH, T, T)
                       const Scalar* qkv,      // (B, T, 3C) per head [q | k | v]
                       int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                       int64_t num_heads, const Dropout& dropout = {});

template <typename Scalar>
void attention_backward(Scalar* dqkv,                 // (B, T, 3C) =
                        const Scalar* doutput,        // (B, T, C)
                        const Scalar* qkv,            // (B, T, 3C)
                        const Scalar* probabilities,  // (B, NH, T, T) from the forward
                        int64_t batch_size, int64_t seq_length, int64_t hidden_size,
                        int64_t num_heads, const Dropout& dropout = {});  // the forward's

}  // namespace backend::cpu
