// dropout_forward / dropout_backward and the keyed masks: the dropped fraction is p, kept
// elements are scaled by exactly 1/(1 − p), the backward applies the same mask, p = 0 is the
// identity, masks are a function of the key (and the key of seed, step, site and layer) alone,
// and the same on every thread count; a slice with first_index draws its slice of the whole
// mask. (Attention's dropout on the probabilities is tested with the attention op,
// tests/backend/ops/attention_test.cpp.)
#include "backend/ops/dropout.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using backend::Dropout;
using backend::dropout_key;
using namespace backend::testing;

// Values in [0.5, 1.5): never 0, so a kept element is told from a dropped one by its value.
std::vector<double> positive_values(size_t count, uint64_t seed) {
  auto values = random_values(count, seed, 0.5);
  for (double& value : values) value += 1.0;
  return values;
}

// The mask as 0/1, read off a forward of all ones.
std::vector<int> mask_of(const Dropout& dropout, int64_t count) {
  const std::vector<double> ones(static_cast<size_t>(count), 1.0);
  std::vector<double> output(ones.size());
  backend::cpu::dropout_forward(output.data(), ones.data(), count, dropout);
  std::vector<int> mask(ones.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = output[i] != 0 ? 1 : 0;
  return mask;
}

double fraction_equal(const std::vector<int>& a, const std::vector<int>& b) {
  int64_t equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i] ? 1 : 0;
  return static_cast<double>(equal) / static_cast<double>(a.size());
}

}  // namespace

TEST_CASE("dropout drops a fraction p and scales the kept elements by exactly 1/(1 - p)") {
  constexpr int64_t count = 1 << 20;
  const auto input = positive_values(count, 1);
  const auto input_single = convert<float>(input);
  for (const double p : {0.1, 0.3, 0.5, 0.9}) {
    CAPTURE(p);
    const Dropout dropout{p, dropout_key(42, 7, 1, 3)};
    std::vector<double> output(count);
    backend::cpu::dropout_forward(output.data(), input.data(), count, dropout);
    std::vector<float> output_single(count);
    backend::cpu::dropout_forward(output_single.data(), input_single.data(), count, dropout);

    const double scale = 1.0 / (1.0 - p);
    const float scale_single = static_cast<float>(scale);
    int64_t dropped = 0;
    bool exact = true;
    for (int64_t i = 0; i < count; ++i) {
      if (output[i] == 0) {
        ++dropped;
        exact = exact && output_single[i] == 0;  // the same mask for float
      } else {
        exact = exact && output[i] == input[i] * scale &&
                output_single[i] == input_single[i] * scale_single;
      }
    }
    CHECK(exact);
    // Five standard deviations of a binomial fraction: sqrt(p(1 − p)/n) ≤ 0.0005 here.
    const double fraction = static_cast<double>(dropped) / count;
    CHECK(std::abs(fraction - p) < 5 * std::sqrt(p * (1 - p) / count));
    // The expectation is kept: E[output] = E[input] (to the same five deviations, roughly).
    double sum_in = 0, sum_out = 0;
    for (int64_t i = 0; i < count; ++i) {
      sum_in += input[i];
      sum_out += output[i];
    }
    CHECK(std::abs(sum_out / sum_in - 1) < 5 * std::sqrt(p / (1 - p) / count) * 1.1);
  }
}

TEST_CASE("the dropout backward applies the forward's mask and scale to the gradient") {
  constexpr int64_t count = 5000;
  const Dropout dropout{0.3, dropout_key(1, 2, 3, 4)};
  const auto input = positive_values(count, 2);
  const auto doutput = random_values(count, 3);
  std::vector<double> output(count), dinput(count, 1000.0);
  backend::cpu::dropout_forward(output.data(), input.data(), count, dropout);
  backend::cpu::dropout_backward(dinput.data(), doutput.data(), count, dropout);
  const double scale = 1 / 0.7;
  int64_t dropped = 0;
  for (int64_t i = 0; i < count; ++i) {
    const bool kept = output[i] != 0;
    dropped += kept ? 0 : 1;
    REQUIRE(dinput[i] == (kept ? doutput[i] * scale : 0.0));
  }
  CHECK(dropped > 0);

  // In place, as the model uses it.
  auto in_place = doutput;
  backend::cpu::dropout_backward(in_place.data(), in_place.data(), count, dropout);
  CHECK(in_place == dinput);
}

TEST_CASE("dropout with p = 0 is the identity, copying or in place") {
  constexpr int64_t count = 100000;
  const auto input = random_values(count, 4);
  std::vector<double> output(count, 5.0);
  const Dropout none{0.0, dropout_key(1, 2, 3, 4)};
  CHECK_FALSE(none.active());
  CHECK(none.threshold() == 0);
  backend::cpu::dropout_forward(output.data(), input.data(), count, none);
  CHECK(output == input);
  backend::cpu::dropout_forward(output.data(), output.data(), count, Dropout{});
  CHECK(output == input);
  backend::cpu::dropout_backward(output.data(), input.data(), count, none);
  CHECK(output == input);
}

TEST_CASE("a dropped NaN or infinity still shows, as in torch's input * mask * scale") {
  constexpr int64_t count = 64;
  const Dropout dropout{0.5, dropout_key(9, 9, 9, 9)};
  const auto mask = mask_of(dropout, count);
  const auto first_dropped = std::find(mask.begin(), mask.end(), 0) - mask.begin();
  REQUIRE(first_dropped < count);
  std::vector<float> input(count, 1.0f), output(count);
  input[first_dropped] = std::numeric_limits<float>::quiet_NaN();
  backend::cpu::dropout_forward(output.data(), input.data(), count, dropout);
  CHECK(std::isnan(output[first_dropped]));
  input[first_dropped] = std::numeric_limits<float>::infinity();
  backend::cpu::dropout_forward(output.data(), input.data(), count, dropout);
  CHECK(std::isnan(output[first_dropped]));  // inf · 0
}

TEST_CASE("a mask is a function of its key, and every part of the key changes it") {
  constexpr int64_t count = 1 << 16;
  constexpr double p = 0.3;
  const auto reference = mask_of({p, dropout_key(1234, 5, 2, 3)}, count);
  CHECK(mask_of({p, dropout_key(1234, 5, 2, 3)}, count) == reference);
  // Two independent masks agree on a fraction p² + (1 − p)² of the elements (0.58 here, to
  // within 5 · 0.002); the same mask would agree everywhere, a correlated one more often.
  const double independent = p * p + (1 - p) * (1 - p);
  const double tolerance = 5 * std::sqrt(independent * (1 - independent) / count);
  struct Variant {
    const char* changed;
    uint64_t key;
  };
  for (const Variant& variant :
       {Variant{"step", dropout_key(1234, 6, 2, 3)}, Variant{"seed", dropout_key(1235, 5, 2, 3)},
        Variant{"site", dropout_key(1234, 5, 1, 3)},
        Variant{"layer", dropout_key(1234, 5, 2, 4)}}) {
    INFO("changed: " << variant.changed);
    const auto other = mask_of({p, variant.key}, count);
    CHECK(other != reference);
    CHECK(std::abs(fraction_equal(other, reference) - independent) < tolerance);
  }
  // The element-level decision is the one dropout_keep() exposes for other twins.
  const uint64_t key = dropout_key(1234, 5, 2, 3);
  const uint64_t threshold = backend::dropout_threshold(p);
  for (int64_t i = 0; i < count; ++i) {
    REQUIRE(backend::dropout_keep(key, static_cast<uint64_t>(i), threshold) == (reference[i] == 1));
  }
}

TEST_CASE("a mask with a stored key reads the key when the op runs, not when it is made") {
  constexpr int64_t count = 4096;
  uint64_t memory = dropout_key(1, 2, 3, 4);
  const Dropout stored{.probability = 0.5, .key = 7, .first_index = 0, .stored_key = &memory};
  CHECK(mask_of(stored, count) == mask_of({0.5, dropout_key(1, 2, 3, 4)}, count));
  memory = dropout_key(1, 3, 3, 4);  // a later micro batch's key, staged at the same address
  CHECK(mask_of(stored, count) == mask_of({0.5, dropout_key(1, 3, 3, 4)}, count));
  CHECK(mask_of(stored, count) != mask_of({0.5, 7}, count));
}

TEST_CASE("the keep threshold is p · 2^64 rounded up") {
  CHECK(backend::dropout_threshold(0.0) == 0);
  CHECK(backend::dropout_threshold(0.5) == (uint64_t{1} << 63));
  CHECK(backend::dropout_threshold(0.25) == (uint64_t{1} << 62));
  CHECK(backend::dropout_threshold(0x1p-64) == 1);
  CHECK(backend::dropout_threshold(0x1.8p-64) == 2);  // 1.5 rounds up
  const double largest = std::nextafter(1.0, 0.0);
  CHECK(backend::dropout_threshold(largest) == ~uint64_t{0} - 2047);  // (1 − 2^-53) · 2^64
}

TEST_CASE("dropout masks are the same on one thread as on several") {
  constexpr int64_t count = 1 << 18;  // far above the parallel threshold
  const auto input = random_values(count, 5);
  const Dropout dropout{0.1, dropout_key(3, 1, 0, 0)};
  auto run = [&] {
    std::vector<float> output(count);
    const auto single = convert<float>(input);
    backend::cpu::dropout_forward(output.data(), single.data(), count, dropout);
    return output;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}

TEST_CASE("a slice with first_index draws that slice of the whole tensor's mask") {
  // Sequence parallelism: each rank holds a slice of the (T, B, C) activations and applies
  // the slice of the mask one process would, so the ranks together drop the same elements.
  constexpr int64_t count = 100003;  // far above the parallel threshold, slices uneven
  const auto input = positive_values(count, 6);
  const auto doutput = random_values(count, 7);
  const Dropout whole{0.3, dropout_key(11, 4, 2, 1)};
  std::vector<double> output(count), dinput(count);
  backend::cpu::dropout_forward(output.data(), input.data(), count, whole);
  backend::cpu::dropout_backward(dinput.data(), doutput.data(), count, whole);
  for (const int64_t parts : {1, 2, 3}) {
    CAPTURE(parts);
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t begin = k * count / parts;
      const int64_t length = (k + 1) * count / parts - begin;
      Dropout slice = whole;
      slice.first_index = static_cast<uint64_t>(begin);
      std::vector<double> slice_output(length), slice_dinput(length);
      backend::cpu::dropout_forward(slice_output.data(), input.data() + begin, length, slice);
      backend::cpu::dropout_backward(slice_dinput.data(), doutput.data() + begin, length, slice);
      CHECK(slice_output ==
            std::vector<double>(output.begin() + begin, output.begin() + begin + length));
      CHECK(slice_dinput ==
            std::vector<double>(dinput.begin() + begin, dinput.begin() + begin + length));
      // float draws the same elements.
      const auto single = convert<float>(
          std::vector<double>(input.begin() + begin, input.begin() + begin + length));
      std::vector<float> single_output(length);
      backend::cpu::dropout_forward(single_output.data(), single.data(), length, slice);
      for (int64_t i = 0; i < length; ++i) {
        REQUIRE((single_output[i] == 0) == (output[begin + i] == 0));
      }
    }
  }
  // An offset mask is a different part of the stream, not the same mask again.
  Dropout shifted = whole;
  shifted.first_index = 1;
  CHECK(mask_of(shifted, 1000) != mask_of(whole, 1000));
}
