// Inverted dropout (Srivastava et al. 2014; torch.nn.functional.dropout, which Megatron core
// applies after the embedding, on the attention probabilities and in bias-dropout-add):
//   keep[i]   = u[i] ≥ p,   u[i] uniform in [0, 1)
//   output[i] = input[i] · (keep[i] ? 1/(1 − p) : 0)
// Backward applies the same mask and scale to the gradient:
//   dinput[i] = doutput[i] · (keep[i] ? 1/(1 − p) : 0)
// (a product with 0 rather than a 0, so a NaN or infinity in a dropped element still shows,
// as in torch's input · mask · scale).
// The mask is not stored: u[i] is a function of (key, i) alone, a counter-based generator
// (splitmix64, Steele, Lea & Flood 2014, the generator of GptModel::init_parameters), so the
// backward regenerates the forward's mask, and neither depends on the thread count or on
// which device computes it. A mask's key hashes (seed, step, site, layer): dropout_key().
// u[i] is the 64-bit output at counter i read as a fraction of 2^64, so an element is dropped
// with probability ⌈p · 2^64⌉ / 2^64 (p to within 2^-64).
// p = 0 is the identity: the ops copy (or, in place, do nothing) and generate nothing.
// A shard of a larger tensor (sequence parallelism: each tensor-parallel rank holds a slice of
// the sequence, Megatron core's sequence_parallel) draws its slice of the whole tensor's mask:
// element i of the op is mask index first_index + i, so the ranks together drop exactly what
// one process would. (Attention's dropout indexes its own (B, NH, T, T) mask and refuses an
// offset: attention.hpp.)
// Contract: no parameters; activation gradients overwrite (=). Elementwise, so output may
// alias input and dinput may alias doutput.
// Dimensions: N elements (any shape, flattened; element i is index first_index + i of the mask).
//
// The key and keep functions are constexpr header code so that a CUDA twin computes the same
// masks (with --expt-relaxed-constexpr, or by marking them __host__ __device__).
#pragma once

#include <cstdint>

#include "backend/common/splitmix64.hpp"
#include "backend/core/cuda_stream.hpp"
#include "backend/core/element_type.hpp"
#include "backend/device/device.hpp"

namespace backend {

namespace detail {
using common::splitmix64_at;
using common::splitmix64_mix;

// XORed into the seed so that a dropout stream never is the initialisation stream of the
// same seed (GptModel::init_parameters keys its stream by splitmix64_mix(seed)).
inline constexpr uint64_t kDropoutDomain = 0x64726F706F757421ull;  // "dropout!"
}  // namespace detail

// The key of one mask: which forward (`step`), where in the model (`site`, `layer`), under
// which seed. Different tuples give unrelated masks.
constexpr uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t site, uint64_t layer) {
  uint64_t key = detail::splitmix64_mix(seed ^ detail::kDropoutDomain);
  key = detail::splitmix64_at(key, step);
  key = detail::splitmix64_at(key, site);
  return detail::splitmix64_at(key, layer);
}

// ⌈p · 2^64⌉: an element is kept iff its 64-bit draw is ≥ this. 0 for p = 0 (all kept).
// p must lie in [0, 1).
constexpr uint64_t dropout_threshold(double probability) {
  const double scaled = probability * 18446744073709551616.0;  // p · 2^64 < 2^64, exact
  const auto truncated = static_cast<uint64_t>(scaled);
  return static_cast<double>(truncated) < scaled ? truncated + 1 : truncated;
}

// Whether element `index` of the mask keyed by `key` is kept.
constexpr bool dropout_keep(uint64_t key, uint64_t index, uint64_t threshold) {
  return detail::splitmix64_at(key, index) >= threshold;
}

// One mask: probability p ∈ [0, 1), its key, and the mask index of the op's element 0. The
// default (p = 0) applies nothing.
// The key is either the value `key` or, with `stored_key`, read from memory on the op's device
// when the op runs: a captured step (docs/step_on_device.md) replays its ops with the arguments
// of the capture, so the keys of each micro batch are staged in device memory and only their
// address is an argument.
struct Dropout {
  double probability = 0;
  uint64_t key = 0;
  uint64_t first_index = 0;  // a slice of a larger tensor's mask: its first element's index
  const uint64_t* stored_key = nullptr;  // on the op's device; null: `key`

  bool active() const { return probability > 0; }
  // The key the mask draws from: called by the twin that runs the op, on memory it can read.
  constexpr uint64_t key_in_force() const { return stored_key != nullptr ? *stored_key : key; }
  uint64_t threshold() const { return dropout_threshold(probability); }
  // 1/(1 − p), computed in double and rounded once to Scalar.
  template <typename Scalar>
  Scalar scale() const {
    return static_cast<Scalar>(1.0 / (1.0 - probability));
  }
};

}  // namespace backend

namespace backend::cpu {

template <typename Scalar>
void dropout_forward(Scalar* output,       // (N)
                     const Scalar* input,  // (N)
                     int64_t count, const Dropout& dropout);

template <typename Scalar>
void dropout_backward(Scalar* dinput,         // (N) =
                      const Scalar* doutput,  // (N)
                      int64_t count, const Dropout& dropout);

}  // namespace backend::cpu

// The CUDA twin (dropout_cuda.cu), Scalar float, bfloat16 or float16: the same mask elements
// (element i is dropout_keep(key, first_index + i, threshold), evaluated on the device), scale =
// dropout.scale<float>().
namespace backend::cuda {

template <typename Scalar>
void dropout_forward(Scalar* output,       // (N)
                     const Scalar* input,  // (N)
                     int64_t count, const Dropout& dropout, CudaStream stream);

template <typename Scalar>
void dropout_backward(Scalar* dinput,         // (N) =
                      const Scalar* doutput,  // (N)
                      int64_t count, const Dropout& dropout, CudaStream stream);

}  // namespace backend::cuda

// The op on `device`'s memory, over all of input's elements (element i is mask index
// dropout.first_index + i).
namespace backend::ops {

void dropout_forward(Device& device, View output, View input, const Dropout& dropout);
void dropout_backward(Device& device, View dinput, View doutput, const Dropout& dropout);

}  // namespace backend::ops
