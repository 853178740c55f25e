// sample_token / sampling_probabilities against hand-computed cases of Megatron's rules
// (sampling.hpp): greedy, top-k, the top-p boundary, temperature, the padding clamp, the seeded
// draw's reproducibility, and the empirical distribution of many draws.
#include "backend/serve/sampling.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "backend/common/error.hpp"

using backend::sample_token;
using backend::sampling_probabilities;
using backend::sampling_uniform;
using backend::SamplingParameters;

namespace {

const SamplingParameters kGreedy{.top_k = 1, .top_p = 0.0, .temperature = 1.0};

std::vector<float> log_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (const double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

}  // namespace

TEST_CASE("greedy sampling takes the largest logit, the lowest index on ties") {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(sample_token(logits, 4, kGreedy, 0.0) == 1);
  CHECK(sample_token(logits, 4, kGreedy, 0.99) == 1);  // the uniform plays no part
  const std::vector<float> last = {1.0f, 0.0f, 2.0f, 7.0f};
  CHECK(sample_token(last, 4, kGreedy, 0.5) == 3);
  // A padding row that wins is clamped to the last real id (Megatron's torch.clamp).
  CHECK(sample_token(last, 3, kGreedy, 0.5) == 2);
  CHECK(sample_token(last, 2, kGreedy, 0.5) == 1);
}

TEST_CASE("top-k keeps exactly the k largest logits") {
  const std::vector<float> logits = {0.0f, 4.0f, 1.0f, 3.0f, 2.0f};
  const std::vector<double> p =
      sampling_probabilities(logits, 5, {.top_k = 2, .top_p = 0.0, .temperature = 1.0});
  CHECK(p[0] == 0.0);
  CHECK(p[2] == 0.0);
  CHECK(p[4] == 0.0);
  CHECK(p[1] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))));
  CHECK(p[3] == doctest::Approx(1.0 / (1.0 + std::exp(1.0))));
  // Three kept of five: e^4, e^3, e^2 over their sum.
  const std::vector<double> three =
      sampling_probabilities(logits, 5, {.top_k = 3, .top_p = 0.0, .temperature = 1.0});
  const double sum = std::exp(4.0) + std::exp(3.0) + std::exp(2.0);
  CHECK(three[4] == doctest::Approx(std::exp(2.0) / sum));
  CHECK(three[0] == 0.0);
  CHECK(three[2] == 0.0);
  // Every draw is one of the k.
  for (uint64_t step = 0; step < 200; ++step) {
    const int32_t id = sample_token(logits, 5, {.top_k = 2, .top_p = 0.0, .temperature = 1.0},
                                    sampling_uniform(7, 0, step));
    CHECK((id == 1 || id == 3));
  }
}

TEST_CASE("top-p keeps the smallest prefix whose mass exceeds p, as Megatron's shifted mask") {
  const std::vector<float> logits = log_of({0.2, 0.5, 0.3});  // sorted: ids 1, 2, 0
  auto kept = [&](double top_p) {
    const std::vector<double> p =
        sampling_probabilities(logits, 3, {.top_k = 0, .top_p = top_p, .temperature = 1.0});
    std::set<int> ids;
    for (int i = 0; i < 3; ++i) {
      if (p[static_cast<size_t>(i)] > 0.0) ids.insert(i);
    }
    return ids;
  };
  CHECK(kept(0.4) == std::set<int>{1});     // 0.5 > 0.4 already: the top token alone
  CHECK(kept(0.6) == std::set<int>{1, 2});  // 0.5 ≤ 0.6 < 0.8
  CHECK(kept(0.85) == std::set<int>{0, 1, 2});
  CHECK(kept(1.0) == std::set<int>{0, 1, 2});
  const std::vector<double> p =
      sampling_probabilities(logits, 3, {.top_k = 0, .top_p = 0.6, .temperature = 1.0});
  CHECK(p[1] == doctest::Approx(0.5 / 0.8));
  CHECK(p[2] == doctest::Approx(0.3 / 0.8));
  // A prefix whose mass equals p exactly keeps the next token too (Megatron filters
  // cum > p, shifted right by one): four equal logits, 0.25 each, exact in binary.
  const std::vector<float> equal = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<double> q =
      sampling_probabilities(equal, 4, {.top_k = 0, .top_p = 0.5, .temperature = 1.0});
  CHECK(q[0] == doctest::Approx(1.0 / 3));
  CHECK(q[1] == doctest::Approx(1.0 / 3));
  CHECK(q[2] == doctest::Approx(1.0 / 3));
  CHECK(q[3] == 0.0);  // ties are sorted lower index first
}

TEST_CASE("temperature divides the logits before the softmax") {
  const std::vector<float> logits = {0.0f, 1.0f};
  const auto p = [&](double temperature) {
    return sampling_probabilities(logits, 2,
                                  {.top_k = 0, .top_p = 0.0, .temperature = temperature})[1];
  };
  CHECK(p(1.0) == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))));
  CHECK(p(2.0) == doctest::Approx(1.0 / (1.0 + std::exp(-0.5))));
  CHECK(p(0.5) == doctest::Approx(1.0 / (1.0 + std::exp(-2.0))));
}

TEST_CASE("a temperature so small that the logits overflow is named as the problem") {
  // 100 / 1e-37 is beyond fp32's largest number: the message names the temperature, not the
  // infinite logits it made.
  const std::vector<float> logits = {100.0f, 1.0f};
  CHECK_THROWS_WITH_AS(
      sampling_probabilities(logits, 2, {.top_k = 0, .top_p = 0.0, .temperature = 1e-37}),
      doctest::Contains("sampling: temperature 1e-37 is too small for these logits: the largest "
                        "logit 100 divided by it overflows 32-bit floating point"),
      common::Error);
  const std::vector<float> negative = {-100.0f, -50.0f};  // both quotients are −inf
  CHECK_THROWS_WITH_AS(
      sampling_probabilities(negative, 2, {.top_k = 0, .top_p = 0.0, .temperature = 1e-37}),
      doctest::Contains("temperature 1e-37 is too small"), common::Error);
}

TEST_CASE("padding rows are never returned, even when they hold most of the mass") {
  // Real vocabulary 3, padded to 6; the padding logits are the largest.
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, 6.0f, 6.0f, 6.0f};
  for (uint64_t step = 0; step < 500; ++step) {
    const double u = sampling_uniform(3, 1, step);
    CHECK(sample_token(logits, 3, {.top_k = 0, .top_p = 0.0, .temperature = 1.0}, u) < 3);
    CHECK(sample_token(logits, 3, {.top_k = 2, .top_p = 0.0, .temperature = 1.0}, u) < 3);
    CHECK(sample_token(logits, 3, {.top_k = 0, .top_p = 0.9, .temperature = 1.0}, u) < 3);
  }
  CHECK(sample_token(logits, 3, kGreedy, 0.0) == 2);
}

TEST_CASE("the seeded draw is reproducible and differs between seeds") {
  CHECK(sampling_uniform(5, 2, 9) == sampling_uniform(5, 2, 9));
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const SamplingParameters plain{.top_k = 0, .top_p = 0.0, .temperature = 1.0};
  int seed_differences = 0;
  int request_differences = 0;
  for (uint64_t step = 0; step < 1000; ++step) {
    const int32_t a = sample_token(logits, 8, plain, sampling_uniform(1, 0, step));
    CHECK(a == sample_token(logits, 8, plain, sampling_uniform(1, 0, step)));
    seed_differences += a != sample_token(logits, 8, plain, sampling_uniform(2, 0, step));
    request_differences += a != sample_token(logits, 8, plain, sampling_uniform(1, 1, step));
  }
  // Independent uniform draws over 8 ids differ 7/8 of the time: ~875 of 1000.
  CHECK(seed_differences > 800);
  CHECK(request_differences > 800);
  for (uint64_t step = 0; step < 1000; ++step) {
    const double u = sampling_uniform(11, 4, step);
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
  }
}

TEST_CASE("the empirical distribution of many draws matches the filtered softmax") {
  const std::vector<float> logits = {0.1f, 1.2f, 0.7f, -0.5f, 1.0f, 0.3f};
  for (const SamplingParameters& parameters :
       {SamplingParameters{.top_k = 0, .top_p = 0.0, .temperature = 1.0},
        SamplingParameters{.top_k = 3, .top_p = 0.0, .temperature = 0.7},
        SamplingParameters{.top_k = 0, .top_p = 0.8, .temperature = 1.3}}) {
    CAPTURE(parameters.top_k);
    CAPTURE(parameters.top_p);
    const std::vector<double> expected = sampling_probabilities(logits, 6, parameters);
    constexpr int kDraws = 40000;
    std::vector<int> counts(6, 0);
    for (int step = 0; step < kDraws; ++step) {
      ++counts[static_cast<size_t>(
          sample_token(logits, 6, parameters, sampling_uniform(2024, 0, step)))];
    }
    double chi_square = 0.0;
    int degrees = -1;
    for (size_t i = 0; i < 6; ++i) {
      if (expected[i] == 0.0) {
        CHECK(counts[i] == 0);
        continue;
      }
      const double mean = expected[i] * kDraws;
      chi_square += (counts[i] - mean) * (counts[i] - mean) / mean;
      ++degrees;
    }
    CAPTURE(chi_square);
    CAPTURE(degrees);
    // The 0.999 quantile of chi-square with ≤ 5 degrees of freedom is below 20.6.
    CHECK(chi_square < 20.6);
  }
}

TEST_CASE("sampling refuses the parameters Megatron asserts against") {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};
  CHECK_THROWS_WITH_AS(sample_token(logits, 4, {.top_k = 2, .top_p = 0.5, .temperature = 1.0}, 0.5),
                       doctest::Contains("cannot set both top_k"), common::Error);
  CHECK_THROWS_WITH_AS(sample_token(logits, 4, {.top_k = 4, .top_p = 0.0, .temperature = 1.0}, 0.5),
                       doctest::Contains("smaller than the vocabulary size"), common::Error);
  CHECK_THROWS_AS(sample_token(logits, 4, {.top_k = 0, .top_p = 1.5, .temperature = 1.0}, 0.5),
                  common::Error);
  CHECK_THROWS_AS(sample_token(logits, 4, {.top_k = 0, .top_p = 0.0, .temperature = 0.0}, 0.5),
                  common::Error);
  CHECK_THROWS_AS(sample_token(logits, 5, kGreedy, 0.5), common::Error);
  CHECK_THROWS_AS(sample_token(logits, 0, kGreedy, 0.5), common::Error);
  CHECK_THROWS_AS(sample_token({}, 1, kGreedy, 0.5), common::Error);
  CHECK_THROWS_AS(sample_token(logits, 4, {.top_k = 0, .top_p = 0.0, .temperature = 1.0}, 1.0),
                  common::Error);
  CHECK_THROWS_AS(sampling_probabilities(logits, 4, kGreedy), common::Error);
}
