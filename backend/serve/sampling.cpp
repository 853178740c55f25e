// Megatron's next-token sampling (sampling.hpp explains the rules and where they come from).
#include "backend/serve/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/common/error.hpp"
#include "backend/common/splitmix64.hpp"

namespace backend {
namespace {

void check_parameters(std::span<const float> logits, int64_t vocab_size,
                      const SamplingParameters& parameters) {
  const int64_t size = std::ssize(logits);
  if (size == 0) common::fail("sampling: the logits are empty");
  if (vocab_size < 1 || vocab_size > size) {
    common::fail("sampling: vocab_size {} must be in [1, {}] (the logits' size)", vocab_size, size);
  }
  if (parameters.top_k < 0) common::fail("sampling: top_k {} must be ≥ 0", parameters.top_k);
  if (parameters.top_k > 0 && parameters.top_p != 0.0) {
    common::fail("sampling: cannot set both top_k ({}) and top_p ({})", parameters.top_k,
                 parameters.top_p);
  }
  if (!(parameters.top_p >= 0.0 && parameters.top_p <= 1.0)) {
    common::fail("sampling: top_p {} must be in [0, 1]", parameters.top_p);
  }
  if (parameters.top_k > 1 && (parameters.top_k >= vocab_size || parameters.top_k > size)) {
    // Megatron: "top-k is larger than vocab size." (it asserts top_k < vocab_size).
    common::fail("sampling: top_k {} must be smaller than the vocabulary size {}", parameters.top_k,
                 vocab_size);
  }
  if (!(parameters.temperature > 0.0) || !std::isfinite(parameters.temperature)) {
    common::fail("sampling: temperature {} must be a positive number", parameters.temperature);
  }
}

int32_t clamp_to_vocabulary(int64_t id, int64_t vocab_size) {
  return static_cast<int32_t>(std::min(id, vocab_size - 1));
}

}  // namespace

double sampling_uniform(uint64_t random_seed, uint64_t request, uint64_t step) {
  // Two levels of the counter-based stream: the request's key from the seed, the step's value
  // from the request's key, so every (seed, request, step) has its own value.
  const uint64_t request_key = common::splitmix64_at(random_seed, request);
  const uint64_t bits = common::splitmix64_at(request_key, step);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

std::vector<double> sampling_probabilities(std::span<const float> logits, int64_t vocab_size,
                                           const SamplingParameters& parameters) {
  check_parameters(logits, vocab_size, parameters);
  if (parameters.top_k == 1) {
    common::fail("sampling: top_k 1 is greedy, which has no distribution to draw from");
  }
  const size_t size = logits.size();
  constexpr float kRemoved = -std::numeric_limits<float>::infinity();
  std::vector<float> scaled(logits.begin(), logits.end());
  if (parameters.temperature != 1.0) {
    const float temperature = static_cast<float>(parameters.temperature);
    for (float& value : scaled) value /= temperature;
  }
  if (parameters.top_k > 1) {
    std::vector<float> sorted = scaled;
    const auto kth = sorted.begin() + (parameters.top_k - 1);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<float>());
    const float threshold = *kth;
    for (float& value : scaled) {
      if (value < threshold) value = kRemoved;
    }
  }
  // Softmax in fp64 over what is left.
  const float largest = *std::max_element(scaled.begin(), scaled.end());
  if (!std::isfinite(largest) && parameters.temperature < 1.0) {
    const float largest_logit = *std::max_element(logits.begin(), logits.end());
    if (std::isfinite(largest_logit)) {
      // Finite logits that the division made infinite: the temperature is what to change.
      common::fail("sampling: temperature {} is too small for these logits: the largest logit "
                   "{} divided by it overflows 32-bit floating point (use a larger temperature, "
                   "or top_k=1 for the most likely token)", parameters.temperature,
                   largest_logit);
    }
  }
  if (!std::isfinite(largest)) {
    common::fail("sampling: the logits have no finite largest value (got {})", largest);
  }
  std::vector<double> probabilities(size, 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < size; ++i) {
    if (scaled[i] == kRemoved) continue;
    probabilities[i] = std::exp(static_cast<double>(scaled[i]) - static_cast<double>(largest));
    sum += probabilities[i];
  }
  for (double& p : probabilities) p /= sum;
  if (parameters.top_p > 0.0) {
    std::vector<size_t> order(size);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return probabilities[a] > probabilities[b]; });
    double cumulative = 0.0;
    size_t kept = size;
    for (size_t i = 0; i < size; ++i) {
      // Token i stays when the mass before it is ≤ top_p (the first always stays).
      if (i > 0 && cumulative > parameters.top_p) {
        kept = i;
        break;
      }
      cumulative += probabilities[order[i]];
    }
    double kept_sum = 0.0;
    for (size_t i = 0; i < size; ++i) {
      if (i >= kept) {
        probabilities[order[i]] = 0.0;
      } else {
        kept_sum += probabilities[order[i]];
      }
    }
    for (double& p : probabilities) p /= kept_sum;
  }
  return probabilities;
}

int32_t sample_token(std::span<const float> logits, int64_t vocab_size,
                     const SamplingParameters& parameters, double uniform) {
  check_parameters(logits, vocab_size, parameters);
  if (parameters.top_k == 1) {
    // std::max_element returns the first of equal maxima, as torch.argmax.
    return clamp_to_vocabulary(std::max_element(logits.begin(), logits.end()) - logits.begin(),
                               vocab_size);
  }
  if (!(uniform >= 0.0 && uniform < 1.0)) {
    common::fail("sampling: the uniform number {} must be in [0, 1)", uniform);
  }
  const std::vector<double> probabilities = sampling_probabilities(logits, vocab_size, parameters);
  double cumulative = 0.0;
  int64_t last_possible = 0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    if (probabilities[i] <= 0.0) continue;
    last_possible = static_cast<int64_t>(i);
    cumulative += probabilities[i];
    if (uniform < cumulative) return clamp_to_vocabulary(last_possible, vocab_size);
  }
  // Rounding left the total just below u: the last id with any mass.
  return clamp_to_vocabulary(last_possible, vocab_size);
}

}  // namespace backend
