// attention_forward / attention_backward: forward against a naive loop over Megatron's
// per-head [q | k | v] layout, causality, backward against central finite differences in
// double, float against double, thread-count independence.
#include "backend/ops/attention.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 5;
constexpr int64_t kHeads = 2;
constexpr int64_t kHeadDim = 3;
constexpr int64_t kHidden = kHeads * kHeadDim;

struct AttentionCase {
  std::vector<double> qkv = random_values(kBatch * kSeq * 3 * kHidden, 71, 1.5);
  std::vector<double> doutput = random_values(kBatch * kSeq * kHidden, 72);
};

struct AttentionResult {
  std::vector<double> output, probabilities, dqkv;
};

template <typename Scalar>
AttentionResult run_attention(const AttentionCase& c) {
  const auto qkv = convert<Scalar>(c.qkv);
  const auto doutput = convert<Scalar>(c.doutput);
  std::vector<Scalar> output(kBatch * kSeq * kHidden);
  std::vector<Scalar> probabilities(kBatch * kHeads * kSeq * kSeq, Scalar{1000});
  std::vector<Scalar> dqkv(qkv.size(), Scalar{1000});  // must be overwritten
  backend::cpu::attention_forward(output.data(), probabilities.data(), qkv.data(), kBatch, kSeq,
                                  kHidden, kHeads);
  backend::cpu::attention_backward(dqkv.data(), doutput.data(), qkv.data(), probabilities.data(),
                                   kBatch, kSeq, kHidden, kHeads);
  return {convert<double>(output), convert<double>(probabilities), convert<double>(dqkv)};
}

// Column of element d of head h's query (part 0), key (1) or value (2) in the qkv row.
int64_t qkv_column(int64_t h, int64_t part, int64_t d) {
  return h * 3 * kHeadDim + part * kHeadDim + d;
}

}  // namespace

TEST_CASE("attention forward matches a naive causal softmax(QK^T/sqrt(HD))·V per head") {
  AttentionCase c;
  const AttentionResult result = run_attention<double>(c);
  const double scale = 1 / std::sqrt(static_cast<double>(kHeadDim));
  double worst = 0;
  for (int64_t b = 0; b < kBatch; ++b) {
    const double* rows = c.qkv.data() + b * kSeq * 3 * kHidden;
    auto at = [&](int64_t t, int64_t h, int64_t part, int64_t d) {
      return rows[t * 3 * kHidden + qkv_column(h, part, d)];
    };
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t i = 0; i < kSeq; ++i) {
        std::vector<double> weights(kSeq, 0.0);
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double score = 0;
          for (int64_t d = 0; d < kHeadDim; ++d) score += at(i, h, 0, d) * at(j, h, 1, d);
          weights[j] = std::exp(score * scale);
          sum += weights[j];
        }
        for (int64_t j = 0; j < kSeq; ++j) {
          const double probability = weights[j] / sum;
          worst = std::max(worst,
                           std::abs(result.probabilities[((b * kHeads + h) * kSeq + i) * kSeq + j] -
                                    probability));
        }
        for (int64_t d = 0; d < kHeadDim; ++d) {
          double expected = 0;
          for (int64_t j = 0; j <= i; ++j) expected += weights[j] / sum * at(j, h, 2, d);
          worst = std::max(
              worst,
              std::abs(result.output[(b * kSeq + i) * kHidden + h * kHeadDim + d] - expected));
        }
      }
    }
  }
  CHECK(worst < 1e-13);
}

TEST_CASE("attention output at position t does not depend on later positions") {
  AttentionCase c;
  const AttentionResult before = run_attention<double>(c);
  // Change everything at the last position of batch row 0.
  for (int64_t i = 0; i < 3 * kHidden; ++i) c.qkv[(kSeq - 1) * 3 * kHidden + i] += 1.0;
  const AttentionResult after = run_attention<double>(c);
  for (int64_t i = 0; i < (kSeq - 1) * kHidden; ++i) CHECK(after.output[i] == before.output[i]);
  bool last_changed = false;
  for (int64_t i = (kSeq - 1) * kHidden; i < kSeq * kHidden; ++i) {
    last_changed = last_changed || after.output[i] != before.output[i];
  }
  CHECK(last_changed);
}

TEST_CASE("attention backward matches central finite differences in double") {
  AttentionCase c;
  const AttentionResult result = run_attention<double>(c);
  std::vector<double> output(kBatch * kSeq * kHidden);
  std::vector<double> probabilities(kBatch * kHeads * kSeq * kSeq);
  auto loss = [&] {
    backend::cpu::attention_forward(output.data(), probabilities.data(), c.qkv.data(), kBatch, kSeq,
                                    kHidden, kHeads);
    return dot(output, c.doutput);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.qkv, result.dqkv, loss), 1e-6);
}

TEST_CASE("attention in float matches double") {
  AttentionCase c;
  const AttentionResult single = run_attention<float>(c);
  const AttentionResult reference = run_attention<double>(c);
  CHECK(error_relative_to_max(single.output, reference.output) < 1e-5);
  CHECK(error_relative_to_max(single.probabilities, reference.probabilities) < 1e-5);
  CHECK(error_relative_to_max(single.dqkv, reference.dqkv) < 1e-5);
}

TEST_CASE("attention is the same on every thread count") {
  // Large enough that the (batch, head) loop runs in parallel.
  constexpr int64_t batch = 2;
  constexpr int64_t seq = 32;
  constexpr int64_t heads = 4;
  constexpr int64_t hidden = heads * 16;
  const auto qkv = random_values(batch * seq * 3 * hidden, 73);
  const auto doutput = random_values(batch * seq * hidden, 74);
  auto run = [&] {
    std::vector<double> output(batch * seq * hidden), probabilities(batch * heads * seq * seq);
    std::vector<double> dqkv(qkv.size());
    backend::cpu::attention_forward(output.data(), probabilities.data(), qkv.data(), batch, seq,
                                    hidden, heads);
    backend::cpu::attention_backward(dqkv.data(), doutput.data(), qkv.data(), probabilities.data(),
                                     batch, seq, hidden, heads);
    output.insert(output.end(), dqkv.begin(), dqkv.end());
    return output;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}
