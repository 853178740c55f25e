// attention_forward / attention_backward (blockwise, grouped-query): forward and backward
// against a naive O(T²) implementation written here from the formulas of attention.hpp (dense
// probabilities, the documented dropout indices), for multi-head (NG = NH), multi-query
// (NG = 1) and grouped (NG = NH/2) attention, with and without dropout, for block sizes that
// do and do not divide T; GQA against multi-head attention on keys and values repeated per
// group (what Megatron core computes); causality; backward against central finite
// differences on 1 and 3 threads; float against double; thread-count independence; bad shapes
// and a dropout mask offset refused.
#include "backend/ops/attention.hpp"

#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "tests/backend/ops/gradient_check.hpp"
#include "sanitized_build.hpp"

namespace {

using backend::Dropout;
using backend::cpu::AttentionBlocks;
using namespace backend::testing;

struct Shape {
  int64_t batch;
  int64_t seq;
  int64_t heads;
  int64_t groups;
  int64_t head_dim;

  int64_t hidden() const { return heads * head_dim; }
  int64_t qkv_width() const { return (heads + 2 * groups) * head_dim; }
  int64_t qkv_size() const { return batch * seq * qkv_width(); }
  int64_t output_size() const { return batch * seq * hidden(); }
  backend::AttentionShape geometry() const {
    return {.batch_size = batch,
            .seq_length = seq,
            .hidden_size = hidden(),
            .num_heads = heads,
            .num_query_groups = groups};
  }
  // Column of element d of head h's query (part 0) or of its group's key (1) or value (2):
  // Megatron core's per-group [q of the group's heads | k | v].
  int64_t column(int64_t h, int64_t part, int64_t d) const {
    const int64_t heads_per_group = heads / groups;
    const int64_t group = h / heads_per_group;
    const int64_t group_begin = group * (heads_per_group + 2) * head_dim;
    if (part == 0) return group_begin + (h % heads_per_group) * head_dim + d;
    return group_begin + (heads_per_group + part - 1) * head_dim + d;
  }
};

struct AttentionResult {
  std::vector<double> output, logsumexp, dqkv;
};

template <typename Scalar>
AttentionResult run_attention(const Shape& shape, const std::vector<double>& qkv_values,
                              const std::vector<double>& doutput_values,
                              const Dropout& dropout = {}, const AttentionBlocks& blocks = {}) {
  const auto qkv = convert<Scalar>(qkv_values);
  const auto doutput = convert<Scalar>(doutput_values);
  std::vector<Scalar> output(static_cast<size_t>(shape.output_size()), Scalar{1000});
  std::vector<Scalar> logsumexp(static_cast<size_t>(shape.batch * shape.heads * shape.seq),
                                Scalar{1000});
  std::vector<Scalar> dqkv(qkv.size(), Scalar{1000});  // must be overwritten
  backend::cpu::attention_forward(output.data(), logsumexp.data(), qkv.data(), shape.geometry(),
                                  dropout, blocks);
  backend::cpu::attention_backward(dqkv.data(), doutput.data(), qkv.data(), output.data(),
                                   logsumexp.data(), shape.geometry(), dropout, blocks);
  return {convert<double>(output), convert<double>(logsumexp), convert<double>(dqkv)};
}

// The whole-matrix computation: per (b, h) the dense T × T scores, probabilities and dropout
// multipliers, then O = D · V, and the backward of attention.hpp's formulas with the row sum
// Σ_k P[i, k] dP[i, k] taken directly (not through O).
AttentionResult reference_attention(const Shape& shape, const std::vector<double>& qkv,
                                    const std::vector<double>& doutput, const Dropout& dropout) {
  const int64_t T = shape.seq;
  const int64_t HD = shape.head_dim;
  const int64_t C = shape.hidden();
  const double scale = 1 / std::sqrt(static_cast<double>(HD));
  AttentionResult result{std::vector<double>(static_cast<size_t>(shape.output_size()), 0.0),
                         std::vector<double>(static_cast<size_t>(shape.batch * shape.heads * T)),
                         std::vector<double>(qkv.size(), 0.0)};
  for (int64_t b = 0; b < shape.batch; ++b) {
    auto at = [&](int64_t t, int64_t h, int64_t part, int64_t d) -> size_t {
      return static_cast<size_t>((b * T + t) * shape.qkv_width() + shape.column(h, part, d));
    };
    for (int64_t h = 0; h < shape.heads; ++h) {
      std::vector<double> p(static_cast<size_t>(T * T), 0.0), keep(p.size(), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> scores(static_cast<size_t>(i + 1));
        for (int64_t j = 0; j <= i; ++j) {
          double score = 0;
          for (int64_t d = 0; d < HD; ++d) score += qkv[at(i, h, 0, d)] * qkv[at(j, h, 1, d)];
          scores[static_cast<size_t>(j)] = score * scale;
        }
        double sum = 0;
        for (const double score : scores) sum += std::exp(score);
        result.logsumexp[static_cast<size_t>((b * shape.heads + h) * T + i)] = std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          const auto index = static_cast<size_t>(i * T + j);
          p[index] = std::exp(scores[static_cast<size_t>(j)]) / sum;
          const auto mask_index = static_cast<uint64_t>(((b * shape.heads + h) * T + i) * T + j);
          keep[index] = !dropout.active() ||
                                backend::dropout_keep(dropout.key, mask_index, dropout.threshold())
                            ? 1 / (1 - dropout.probability)
                            : 0.0;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        const size_t out_row = static_cast<size_t>((b * T + i) * C + h * HD);
        // Forward: O[i] = Σ_j P[i, j] · keep[i, j] · V[j].
        for (int64_t d = 0; d < HD; ++d) {
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            sum += p[static_cast<size_t>(i * T + j)] * keep[static_cast<size_t>(i * T + j)] *
                   qkv[at(j, h, 2, d)];
          }
          result.output[out_row + static_cast<size_t>(d)] = sum;
        }
        // Backward of row i.
        std::vector<double> dp(static_cast<size_t>(i + 1));
        double row_dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const auto index = static_cast<size_t>(i * T + j);
          double dd = 0;
          for (int64_t d = 0; d < HD; ++d) {
            dd += doutput[out_row + static_cast<size_t>(d)] * qkv[at(j, h, 2, d)];
          }
          dp[static_cast<size_t>(j)] = dd * keep[index];
          row_dot += p[index] * dp[static_cast<size_t>(j)];
          for (int64_t d = 0; d < HD; ++d) {
            result.dqkv[at(j, h, 2, d)] +=
                p[index] * keep[index] * doutput[out_row + static_cast<size_t>(d)];
          }
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds =
              p[static_cast<size_t>(i * T + j)] * (dp[static_cast<size_t>(j)] - row_dot);
          for (int64_t d = 0; d < HD; ++d) {
            result.dqkv[at(i, h, 0, d)] += scale * ds * qkv[at(j, h, 1, d)];
            result.dqkv[at(j, h, 1, d)] += scale * ds * qkv[at(i, h, 0, d)];
          }
        }
      }
    }
  }
  return result;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  return max_abs(difference(a, b));
}

// NH = 4: multi-head, multi-query and two groups of two heads.
constexpr int64_t kGroupCounts[] = {4, 1, 2};

}  // namespace

TEST_CASE("NG = NH is Megatron's per-head [q | k | v] layout") {
  const Shape shape{.batch = 1, .seq = 1, .heads = 4, .groups = 4, .head_dim = 3};
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t part = 0; part < 3; ++part) {
      for (int64_t d = 0; d < 3; ++d) CHECK(shape.column(h, part, d) == h * 9 + part * 3 + d);
    }
  }
}

TEST_CASE("blockwise attention equals a naive O(T²) reference in double") {
  struct Case {
    int64_t seq;
    AttentionBlocks blocks;
  };
  // The default blocks with T not a multiple of them (two full query blocks and a partial
  // one), square small blocks, and query blocks taller and shorter than key blocks (rows that
  // see nothing of a diagonal block).
  const Case cases[] = {{150, {}},
                        {150, {.query_rows = 128, .key_rows = 32}},
                        {11, {.query_rows = 4, .key_rows = 4}},
                        {11, {.query_rows = 4, .key_rows = 3}},
                        {11, {.query_rows = 3, .key_rows = 5}},
                        {1, {.query_rows = 2, .key_rows = 2}}};
  for (const Case& c : cases) {
    for (const int64_t groups : kGroupCounts) {
      for (const double p : {0.0, 0.3}) {
        const Shape shape{.batch = 2, .seq = c.seq, .heads = 4, .groups = groups, .head_dim = 8};
        CAPTURE(c.seq);
        CAPTURE(c.blocks.query_rows);
        CAPTURE(c.blocks.key_rows);
        CAPTURE(groups);
        CAPTURE(p);
        const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 71, 1.5);
        const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 72);
        const Dropout dropout{p, backend::dropout_key(5, 0, 1, 0)};
        const AttentionResult result =
            run_attention<double>(shape, qkv, doutput, dropout, c.blocks);
        const AttentionResult reference = reference_attention(shape, qkv, doutput, dropout);
        CHECK(max_difference(result.output, reference.output) < 1e-6);
        CHECK(max_difference(result.logsumexp, reference.logsumexp) < 1e-6);
        CHECK(max_difference(result.dqkv, reference.dqkv) < 1e-6);
        CHECK(max_abs(reference.dqkv) > 1e-2);  // the comparison is not between zeros
      }
    }
  }
}

TEST_CASE("attention dropout drops probabilities and changes the output and every gradient") {
  const Shape shape{.batch = 2, .seq = 40, .heads = 4, .groups = 2, .head_dim = 8};
  const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 81, 1.5);
  const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 82);
  const AttentionBlocks blocks{.query_rows = 16, .key_rows = 8};
  const AttentionResult plain = run_attention<double>(shape, qkv, doutput, {}, blocks);
  const AttentionResult dropped = run_attention<double>(
      shape, qkv, doutput, Dropout{0.4, backend::dropout_key(5, 0, 1, 0)}, blocks);
  // The log-sum-exp is that of the probabilities before dropout.
  CHECK(max_difference(dropped.logsumexp, plain.logsumexp) == 0);
  CHECK(max_difference(dropped.output, plain.output) > 1e-2);
  // Every key and value row (bar the last position's key, which only its own query sees) and
  // every query row gets a different gradient.
  int64_t unchanged = 0;
  for (size_t i = 0; i < plain.dqkv.size(); ++i) unchanged += plain.dqkv[i] == dropped.dqkv[i];
  CHECK(unchanged < shape.qkv_size() / 20);
}

TEST_CASE("attention with a stored key reads it when it runs (a captured step's masks)") {
  const Shape shape{.batch = 1, .seq = 24, .heads = 2, .groups = 1, .head_dim = 8};
  const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 83, 1.5);
  const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 84);
  const AttentionBlocks blocks{.query_rows = 8, .key_rows = 8};
  uint64_t memory = 0;
  const Dropout stored{.probability = 0.3, .key = 1, .first_index = 0, .stored_key = &memory};
  for (const uint64_t key : {backend::dropout_key(5, 0, 1, 0), backend::dropout_key(5, 1, 1, 0)}) {
    memory = key;  // after the Dropout was made, as a replay finds the staged key
    const AttentionResult by_value =
        run_attention<double>(shape, qkv, doutput, Dropout{0.3, key}, blocks);
    const AttentionResult read = run_attention<double>(shape, qkv, doutput, stored, blocks);
    CHECK(read.output == by_value.output);
    CHECK(read.dqkv == by_value.dqkv);
  }
}

TEST_CASE(
    "grouped-query attention equals multi-head attention on keys and values repeated per "
    "group") {
  // Megatron core expands each group's k and v to its heads (repeat_interleave) and runs
  // multi-head attention; the key and value gradients of a group are the sums over its heads.
  for (const int64_t groups : {1, 2}) {
    for (const double p : {0.0, 0.2}) {
      CAPTURE(groups);
      CAPTURE(p);
      const Shape grouped{.batch = 2, .seq = 23, .heads = 4, .groups = groups, .head_dim = 5};
      const Shape expanded{.batch = 2, .seq = 23, .heads = 4, .groups = 4, .head_dim = 5};
      const auto qkv = random_values(static_cast<size_t>(grouped.qkv_size()), 91, 1.5);
      const auto doutput = random_values(static_cast<size_t>(grouped.output_size()), 92);
      std::vector<double> expanded_qkv(static_cast<size_t>(expanded.qkv_size()));
      for (int64_t row = 0; row < grouped.batch * grouped.seq; ++row) {
        for (int64_t h = 0; h < 4; ++h) {
          for (int64_t part = 0; part < 3; ++part) {
            for (int64_t d = 0; d < 5; ++d) {
              expanded_qkv[static_cast<size_t>(row * expanded.qkv_width() +
                                               expanded.column(h, part, d))] =
                  qkv[static_cast<size_t>(row * grouped.qkv_width() + grouped.column(h, part, d))];
            }
          }
        }
      }
      const Dropout dropout{p, backend::dropout_key(9, 1, 1, 3)};
      const AttentionBlocks blocks{.query_rows = 8, .key_rows = 8};
      const AttentionResult g = run_attention<double>(grouped, qkv, doutput, dropout, blocks);
      const AttentionResult e =
          run_attention<double>(expanded, expanded_qkv, doutput, dropout, blocks);
      CHECK(max_difference(g.output, e.output) < 1e-12);
      CHECK(max_difference(g.logsumexp, e.logsumexp) < 1e-12);
      std::vector<double> summed(qkv.size(), 0.0);
      for (int64_t row = 0; row < grouped.batch * grouped.seq; ++row) {
        for (int64_t h = 0; h < 4; ++h) {
          for (int64_t part = 0; part < 3; ++part) {
            for (int64_t d = 0; d < 5; ++d) {
              const auto target =
                  static_cast<size_t>(row * grouped.qkv_width() + grouped.column(h, part, d));
              summed[target] += e.dqkv[static_cast<size_t>(row * expanded.qkv_width() +
                                                           expanded.column(h, part, d))];
            }
          }
        }
      }
      CHECK(max_difference(g.dqkv, summed) < 1e-12);
    }
  }
}

TEST_CASE("attention output at position t does not depend on later positions") {
  const Shape shape{.batch = 2, .seq = 13, .heads = 4, .groups = 2, .head_dim = 3};
  auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 71, 1.5);
  const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 72);
  const AttentionBlocks blocks{.query_rows = 4, .key_rows = 4};
  const AttentionResult before = run_attention<double>(shape, qkv, doutput, {}, blocks);
  // Change everything at the last position of batch row 0.
  const int64_t width = shape.qkv_width();
  for (int64_t i = 0; i < width; ++i) qkv[static_cast<size_t>((shape.seq - 1) * width + i)] += 1.0;
  const AttentionResult after = run_attention<double>(shape, qkv, doutput, {}, blocks);
  const int64_t C = shape.hidden();
  for (int64_t i = 0; i < (shape.seq - 1) * C; ++i) {
    CHECK(after.output[static_cast<size_t>(i)] == before.output[static_cast<size_t>(i)]);
  }
  bool last_changed = false;
  for (int64_t i = (shape.seq - 1) * C; i < shape.seq * C; ++i) {
    last_changed = last_changed ||
                   after.output[static_cast<size_t>(i)] != before.output[static_cast<size_t>(i)];
  }
  CHECK(last_changed);
}

namespace {

// Central differences of dot(output, doutput) against attention_backward, with and without
// dropout, on one thread for every element and on three for every third. B·NH·T²·HD is above
// the ops' parallel threshold, so three threads really share the work; T = 19 is a multiple
// of neither block size. The sanitized build probes every fourth element on one thread and
// every twelfth on three: each probe runs the same forward over the whole tensor, so the code
// the sanitizers watch is the same, at a quarter of the 40 s the full probe took there.
void check_attention_gradient(int64_t groups) {
  const AttentionBlocks blocks{.query_rows = 5, .key_rows = 4};
  const size_t stride = test_support::kSanitizedBuild ? 4 : 1;
  for (const double p : {0.0, 0.3}) {
    CAPTURE(p);
    const Shape shape{.batch = 2, .seq = 19, .heads = 4, .groups = groups, .head_dim = 8};
    auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 73, 1.5);
    const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 74);
    const Dropout dropout{p, backend::dropout_key(6, 0, 1, 2)};
    std::vector<size_t> serial_elements;
    std::vector<size_t> parallel_elements;
    for (size_t i = 0; i < qkv.size(); i += stride) serial_elements.push_back(i);
    for (size_t i = 0; i < qkv.size(); i += 3 * stride) parallel_elements.push_back(i);
    bool serial_pass = true;
    const auto [serial, parallel] = on_one_and_three_threads([&] {
      const AttentionResult result = run_attention<double>(shape, qkv, doutput, dropout, blocks);
      std::vector<double> output(static_cast<size_t>(shape.output_size()));
      std::vector<double> logsumexp(static_cast<size_t>(shape.batch * shape.heads * shape.seq));
      auto loss = [&] {
        backend::cpu::attention_forward(output.data(), logsumexp.data(), qkv.data(),
                                        shape.geometry(), dropout, blocks);
        return dot(output, doutput);
      };
      GradientCheckOptions options;
      options.indices = serial_pass ? serial_elements : parallel_elements;
      serial_pass = false;
      return check_gradient(qkv, result.dqkv, loss, options);
    });
    CHECK(serial.checked == serial_elements.size());
    CHECK(parallel.checked == parallel_elements.size());
    BACKEND_CHECK_GRADIENT(serial, 1e-6);
    BACKEND_CHECK_GRADIENT(parallel, 1e-6);
  }
}

}  // namespace

// The sanitized build checks the grouped case, whose indexing covers the other two (about a
// minute of the sanitized suite's time each); the release build checks all three.
TEST_CASE("attention backward matches central finite differences (NG = NH, multi-head)" *
          test_support::release_only()) {
  check_attention_gradient(4);
}

TEST_CASE("attention backward matches central finite differences (NG = 1, multi-query)" *
          test_support::release_only()) {
  check_attention_gradient(1);
}

TEST_CASE("attention backward matches central finite differences (NG = NH/2, grouped)") {
  check_attention_gradient(2);
}

TEST_CASE("attention in float matches double") {
  for (const int64_t groups : kGroupCounts) {
    CAPTURE(groups);
    const Shape shape{.batch = 2, .seq = 150, .heads = 4, .groups = groups, .head_dim = 16};
    const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 75, 1.5);
    const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 76);
    const Dropout dropout{0.1, backend::dropout_key(8, 2, 1, 0)};
    const AttentionResult single = run_attention<float>(shape, qkv, doutput, dropout);
    const AttentionResult reference = run_attention<double>(shape, qkv, doutput, dropout);
    CHECK(error_relative_to_max(single.output, reference.output) < 1e-5);
    CHECK(error_relative_to_max(single.logsumexp, reference.logsumexp) < 1e-5);
    CHECK(error_relative_to_max(single.dqkv, reference.dqkv) < 1e-5);
  }
}

TEST_CASE("attention is the same on every thread count") {
  for (const int64_t groups : kGroupCounts) {
    for (const double p : {0.0, 0.1}) {
      CAPTURE(groups);
      CAPTURE(p);
      const Shape shape{.batch = 2, .seq = 150, .heads = 4, .groups = groups, .head_dim = 16};
      const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 77);
      const auto doutput = random_values(static_cast<size_t>(shape.output_size()), 78);
      const Dropout dropout{p, backend::dropout_key(7, 3, 1, 1)};
      auto run = [&] {
        AttentionResult result = run_attention<float>(shape, qkv, doutput, dropout);
        result.output.insert(result.output.end(), result.logsumexp.begin(), result.logsumexp.end());
        result.output.insert(result.output.end(), result.dqkv.begin(), result.dqkv.end());
        return result.output;
      };
      const auto [serial, parallel] = on_one_and_three_threads(run);
      CHECK(serial == parallel);
    }
  }
}

TEST_CASE("attention refuses shapes it cannot lay out, naming the numbers") {
  std::vector<double> buffer(1024);
  auto forward = [&](int64_t hidden, int64_t heads, int64_t groups, AttentionBlocks blocks) {
    backend::cpu::attention_forward(buffer.data(), buffer.data(), buffer.data(),
                                    {.batch_size = 1,
                                     .seq_length = 2,
                                     .hidden_size = hidden,
                                     .num_heads = heads,
                                     .num_query_groups = groups},
                                    {}, blocks);
  };
  CHECK_THROWS_WITH_AS(forward(12, 4, 3, {}),
                       "attention_forward: 3 query groups must divide the 4 heads", common::Error);
  CHECK_THROWS_WITH_AS(forward(12, 4, 0, {}),
                       "attention_forward: 0 query groups must divide the 4 heads", common::Error);
  CHECK_THROWS_WITH_AS(forward(10, 4, 4, {}),
                       "attention_forward: 4 heads must divide the hidden size 10", common::Error);
  CHECK_THROWS_AS(forward(12, 4, 4, {.query_rows = 0, .key_rows = 4}), common::Error);
  std::vector<double> gradient(1024);
  CHECK_THROWS_AS(backend::cpu::attention_backward(gradient.data(), buffer.data(), buffer.data(),
                                                   buffer.data(), buffer.data(),
                                                   {.batch_size = 1,
                                                    .seq_length = 2,
                                                    .hidden_size = 12,
                                                    .num_heads = 4,
                                                    .num_query_groups = 3}),
                  common::Error);
}

TEST_CASE("attention refuses a dropout with a mask offset (first_index)") {
  // Its mask is the (B, NH, T, T) probabilities' own; first_index is for slices of the
  // elementwise dropout's tensors and would silently shift these masks.
  const Shape shape{.batch = 1, .seq = 4, .heads = 2, .groups = 2, .head_dim = 3};
  std::vector<double> qkv(shape.qkv_size(), 0.5), output(shape.output_size());
  std::vector<double> logsumexp(shape.batch * shape.heads * shape.seq);
  std::vector<double> dqkv(shape.qkv_size());
  for (const double p : {0.0, 0.1}) {
    CAPTURE(p);
    Dropout dropout{p, backend::dropout_key(1, 2, 3, 4)};
    dropout.first_index = 12;
    CHECK_THROWS_AS(backend::cpu::attention_forward(output.data(), logsumexp.data(), qkv.data(),
                                                    shape.geometry(), dropout),
                    common::Error);
    CHECK_THROWS_AS(
        backend::cpu::attention_backward(dqkv.data(), output.data(), qkv.data(), output.data(),
                                         logsumexp.data(), shape.geometry(), dropout),
        common::Error);
  }
  // The message names the op and the field.
  Dropout dropout;
  dropout.first_index = 7;
  try {
    backend::cpu::attention_forward(output.data(), logsumexp.data(), qkv.data(), shape.geometry(),
                                    dropout);
    FAIL("attention_forward accepted first_index 7");
  } catch (const common::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("attention_forward") != std::string::npos);
    CHECK(message.find("first_index (got 7)") != std::string::npos);
  }
}

TEST_CASE("attention over a key/value cache equals attention_forward, prefill and decode") {
  // Two sequences (the batch) in slots 2 and 0 of a 3-slot cache: the first T−1 positions of
  // both prefilled in one call (interleaved rows), then the last positions decoded in a second;
  // every row equals attention_forward's output at its position.
  for (const int64_t groups : {int64_t{4}, int64_t{2}, int64_t{1}}) {
    const Shape shape{2, 9, 4, groups, 8};
    const int64_t slots = 3, max_length = 12, width = shape.qkv_width(), hidden = shape.hidden();
    const auto qkv = random_values(static_cast<size_t>(shape.qkv_size()), 95);
    std::vector<double> expected(static_cast<size_t>(shape.output_size()));
    std::vector<double> logsumexp(static_cast<size_t>(shape.batch * shape.heads * shape.seq));
    backend::cpu::attention_forward(expected.data(), logsumexp.data(), qkv.data(),
                                    shape.geometry());
    const int32_t slot_of[2] = {2, 0};
    const size_t cache = static_cast<size_t>(slots * max_length * groups * shape.head_dim);
    std::vector<double> keys(cache, NAN), values(cache, NAN);  // unfilled places never read
    auto run = [&](int64_t first, int64_t last) {  // positions [first, last) of both sequences
      std::vector<double> rows_qkv, output;
      std::vector<int32_t> row_slots, positions;
      for (int64_t t = first; t < last; ++t) {
        for (int64_t b = 0; b < 2; ++b) {
          const auto begin = qkv.begin() + (b * shape.seq + t) * width;
          rows_qkv.insert(rows_qkv.end(), begin, begin + width);
          row_slots.push_back(slot_of[b]);
          positions.push_back(static_cast<int32_t>(t));
        }
      }
      const auto rows = static_cast<int64_t>(positions.size());
      output.assign(static_cast<size_t>(rows * hidden), NAN);
      backend::cpu::kv_cache_attention_forward(output.data(), keys.data(), values.data(),
                                               rows_qkv.data(), row_slots.data(),
                                               positions.data(), rows, shape.heads, groups,
                                               shape.head_dim, max_length);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = r % 2, t = first + r / 2;
        for (int64_t c = 0; c < hidden; ++c) {
          CHECK(output[static_cast<size_t>(r * hidden + c)] ==
                doctest::Approx(expected[static_cast<size_t>((b * shape.seq + t) * hidden + c)])
                    .epsilon(1e-12));
        }
      }
    };
    run(0, shape.seq - 1);
    run(shape.seq - 1, shape.seq);
  }
}
