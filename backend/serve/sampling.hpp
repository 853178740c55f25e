// Megatron's choice of the next token from one position's logits (megatron/inference/
// text_generation/sampling.py, `sample`, as of Megatron core 0.12; facts only):
//   top_k == 1            greedy: the index of the largest logit over the padded vocabulary
//                         (the lowest index among equal maxima, as torch.argmax);
//   otherwise             logits / temperature (in fp32, as Megatron's div_), then
//     top_k > 1           every logit below the k-th largest is removed (set to −inf); logits
//                         equal to the k-th largest all stay, so ties can keep more than k;
//     top_p > 0           nucleus: sort the probabilities in descending order (ties: the lower
//                         index first), take the cumulative sums c_0 ≤ c_1 ≤ ...; the i-th
//                         sorted token is kept when i = 0 or c_{i−1} ≤ top_p. That is the
//                         smallest prefix whose mass exceeds top_p strictly (a prefix whose mass
//                         equals top_p keeps the next token too), as Megatron's "shift the
//                         cum_probs > top_p mask right by one" does;
//   then one draw from the softmax of what is left.
// The padded vocabulary's extra rows (ids ≥ vocab_size) take part as Megatron lets them, and
// the chosen id is then clamped to vocab_size − 1 (Megatron's torch.clamp): a padding id is
// never returned, and if one wins, the last real id is returned in its place.
//
// The draw is ours, not torch's: a uniform u in [0, 1) from splitmix64 keyed by (random seed,
// request, step) (backend/common/splitmix64.hpp), and the id is the first whose cumulative
// probability (in id order) exceeds u. A seed therefore gives the same tokens on any thread
// count and device, but not the tokens torch.multinomial gives Megatron for the same seed.
// The softmax and sums are in fp64 (Megatron: fp32), so a top-p boundary decision can differ
// from Megatron's only when a cumulative mass lies within fp32 rounding of top_p.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace backend {

struct SamplingParameters {
  int64_t top_k = 0;   // 1: greedy; > 1: top-k; 0: off
  double top_p = 0.0;  // > 0: nucleus (not with top_k > 0)
  double temperature = 1.0;
};

// The uniform number in [0, 1) of one draw: step `step` of request `request` under
// `random_seed` (53 random bits of splitmix64).
double sampling_uniform(uint64_t random_seed, uint64_t request, uint64_t step);

// The probabilities the draw is made from, over all of `logits` (the padded vocabulary),
// after temperature, top-k and top-p; entries removed by the filters are exactly 0. Not for
// top_k == 1 (greedy has no distribution). common::Error for parameters Megatron asserts
// against: top_k and top_p both set, top_k ≥ vocab_size or > the logits' size, top_p > 1,
// temperature ≤ 0, vocab_size outside [1, logits.size()], empty logits.
std::vector<double> sampling_probabilities(std::span<const float> logits, int64_t vocab_size,
                                           const SamplingParameters& parameters);

// The next token: greedy for top_k == 1, else the draw with `uniform` (sampling_uniform) from
// sampling_probabilities; clamped to vocab_size − 1 in both cases. Same errors.
int32_t sample_token(std::span<const float> logits, int64_t vocab_size,
                     const SamplingParameters& parameters, double uniform);

}  // namespace backend
