// rope_tables / rope_forward / rope_backward: the forward against Megatron's formula written
// out directly (cat(θ, θ), rotate_half), the relative-position property that motivates RoPE,
// the backward against central finite differences in double, partial rotation
// (--rotary-percent), heads inside a wider row, in-place use, float against double, threads;
// Llama 3's frequency scaling band by band.
#include "backend/ops/rope.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kRopeBatch = 2;
constexpr int64_t kRopeSeq = 5;
constexpr int64_t kHeads = 3;
constexpr int64_t kHeadDim = 8;
constexpr double kBase = 10000.0;

// Megatron's recipe in double, one head vector at a time: inv_freq from arange(0, R, 2) / R,
// emb = cat(freqs, freqs), x · cos(emb) + rotate_half(x) · sin(emb) on the first R features.
std::vector<double> reference_rotation(const std::vector<double>& x, int64_t position,
                                       int64_t rotary_dim, double base) {
  const int64_t half = rotary_dim / 2;
  std::vector<double> emb(static_cast<size_t>(rotary_dim));
  for (int64_t i = 0; i < half; ++i) {
    const double frequency = 1.0 / std::pow(base, static_cast<double>(2 * i) / rotary_dim);
    emb[i] = emb[i + half] = static_cast<double>(position) * frequency;
  }
  std::vector<double> rotated_half(static_cast<size_t>(rotary_dim));
  for (int64_t i = 0; i < half; ++i) {
    rotated_half[i] = -x[i + half];
    rotated_half[i + half] = x[i];
  }
  std::vector<double> y = x;
  for (int64_t i = 0; i < rotary_dim; ++i) {
    y[i] = x[i] * std::cos(emb[i]) + rotated_half[i] * std::sin(emb[i]);
  }
  return y;
}

struct RopeShape {
  int64_t rotary_dim = kHeadDim;
  int64_t row_stride = kHeads * kHeadDim;
  int64_t seq_length = kRopeSeq;
};

template <typename Scalar>
std::pair<std::vector<Scalar>, std::vector<Scalar>> tables(const RopeShape& shape) {
  std::vector<Scalar> cos(static_cast<size_t>(shape.seq_length * shape.rotary_dim / 2));
  std::vector<Scalar> sin(cos.size());
  backend::cpu::rope_tables(cos.data(), sin.data(), shape.seq_length, shape.rotary_dim, kBase, {});
  return {cos, sin};
}

template <typename Scalar>
std::vector<double> run_forward(const std::vector<double>& input, const RopeShape& shape,
                                double fill = 1000) {
  const auto [cos, sin] = tables<Scalar>(shape);
  const auto x = convert<Scalar>(input);
  std::vector<Scalar> y(x.size(), static_cast<Scalar>(fill));
  backend::cpu::rope_forward(y.data(), x.data(), cos.data(), sin.data(), kRopeBatch, shape.seq_length,
                             kHeads, kHeadDim, shape.rotary_dim, shape.row_stride);
  return convert<double>(y);
}

template <typename Scalar>
std::vector<double> run_backward(const std::vector<double>& doutput, const RopeShape& shape) {
  const auto [cos, sin] = tables<Scalar>(shape);
  const auto dy = convert<Scalar>(doutput);
  std::vector<Scalar> dx(dy.size(), Scalar{0});
  backend::cpu::rope_backward(dx.data(), dy.data(), cos.data(), sin.data(), kRopeBatch,
                              shape.seq_length, kHeads, kHeadDim, shape.rotary_dim,
                              shape.row_stride);
  return convert<double>(dx);
}

size_t count(const RopeShape& shape) {
  return static_cast<size_t>(kRopeBatch * shape.seq_length * shape.row_stride);
}

}  // namespace

TEST_CASE("rope forward is Megatron's cat(θ, θ) / rotate_half formula, heads in a wider row") {
  for (const int64_t rotary_dim : {int64_t{8}, int64_t{4}, int64_t{2}}) {
    CAPTURE(rotary_dim);
    // Two spare columns per row that the op must leave alone.
    const RopeShape shape{
        .rotary_dim = rotary_dim, .row_stride = kHeads * kHeadDim + 2, .seq_length = kRopeSeq};
    const auto input = random_values(count(shape), 41);
    const auto output = run_forward<double>(input, shape, 7.0);
    double worst = 0;
    for (int64_t b = 0; b < kRopeBatch; ++b) {
      for (int64_t t = 0; t < kRopeSeq; ++t) {
        const int64_t row = (b * kRopeSeq + t) * shape.row_stride;
        for (int64_t h = 0; h < kHeads; ++h) {
          const auto begin = input.begin() + row + h * kHeadDim;
          const std::vector<double> x(begin, begin + kHeadDim);
          const auto expected = reference_rotation(x, t, rotary_dim, kBase);
          for (int64_t i = 0; i < kHeadDim; ++i) {
            worst = std::max(worst, std::abs(output[row + h * kHeadDim + i] - expected[i]));
          }
        }
        CHECK(output[row + kHeads * kHeadDim] == 7.0);
        CHECK(output[row + kHeads * kHeadDim + 1] == 7.0);
      }
    }
    CHECK(worst < 1e-14);
  }
}

TEST_CASE("rope: position 0 is the identity, pair 0 turns by t radians, norms are kept") {
  const RopeShape shape;
  const auto input = random_values(count(shape), 42);
  const auto output = run_forward<double>(input, shape);
  for (int64_t b = 0; b < kRopeBatch; ++b) {
    for (int64_t t = 0; t < kRopeSeq; ++t) {
      const int64_t row = (b * kRopeSeq + t) * shape.row_stride;
      for (int64_t h = 0; h < kHeads; ++h) {
        const double* x = input.data() + row + h * kHeadDim;
        const double* y = output.data() + row + h * kHeadDim;
        double x_norm = 0, y_norm = 0;
        for (int64_t i = 0; i < kHeadDim; ++i) {
          x_norm += x[i] * x[i];
          y_norm += y[i] * y[i];
          if (t == 0) CHECK(y[i] == x[i]);
        }
        CHECK(y_norm == doctest::Approx(x_norm).epsilon(1e-13));
        // Pair (0, half) has frequency base^0 = 1: the angle is the position itself.
        const double angle = static_cast<double>(t);
        CHECK(y[0] == doctest::Approx(x[0] * std::cos(angle) - x[4] * std::sin(angle)));
        CHECK(y[4] == doctest::Approx(x[4] * std::cos(angle) + x[0] * std::sin(angle)));
      }
    }
  }
}

TEST_CASE("rope: the query-key product depends on the distance between positions only") {
  // q at position m and k at position n: ⟨R_m q, R_n k⟩ = ⟨R_{m−n} q, k⟩. One head, one row
  // per position, the same q and k vectors everywhere.
  constexpr int64_t seq = 9;
  const RopeShape shape{.rotary_dim = kHeadDim, .row_stride = kHeadDim, .seq_length = seq};
  const auto q = random_values(kHeadDim, 43);
  const auto k = random_values(kHeadDim, 44);
  std::vector<double> queries, keys;
  for (int64_t t = 0; t < seq; ++t) {
    queries.insert(queries.end(), q.begin(), q.end());
    keys.insert(keys.end(), k.begin(), k.end());
  }
  const auto [cos, sin] = tables<double>(shape);
  std::vector<double> rotated_q(queries.size()), rotated_k(keys.size());
  backend::cpu::rope_forward(rotated_q.data(), queries.data(), cos.data(), sin.data(), 1, seq, 1,
                             kHeadDim, kHeadDim, kHeadDim);
  backend::cpu::rope_forward(rotated_k.data(), keys.data(), cos.data(), sin.data(), 1, seq, 1,
                             kHeadDim, kHeadDim, kHeadDim);
  auto score = [&](int64_t m, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < kHeadDim; ++i)
      sum += rotated_q[m * kHeadDim + i] * rotated_k[n * kHeadDim + i];
    return sum;
  };
  for (int64_t distance = 0; distance < 4; ++distance) {
    CAPTURE(distance);
    for (int64_t n = 0; n + distance < seq; ++n) {
      CHECK(score(n + distance, n) == doctest::Approx(score(distance, 0)).epsilon(1e-12));
    }
  }
  CHECK(score(3, 0) != doctest::Approx(score(2, 0)));
}

TEST_CASE("rope backward matches central finite differences in double, and inverts forward") {
  for (const int64_t rotary_dim : {int64_t{8}, int64_t{6}}) {
    CAPTURE(rotary_dim);
    const RopeShape shape{
        .rotary_dim = rotary_dim, .row_stride = kHeads * kHeadDim, .seq_length = kRopeSeq};
    auto input = random_values(count(shape), 45);
    const auto doutput = random_values(count(shape), 46);
    const auto dinput = run_backward<double>(doutput, shape);
    auto loss = [&] { return dot(run_forward<double>(input, shape), doutput); };
    BACKEND_CHECK_GRADIENT(check_gradient(input, dinput, loss), 1e-6);
    // The backward is the inverse rotation: applied to the forward's output it gives the input.
    const auto round_trip = run_backward<double>(run_forward<double>(input, shape), shape);
    CHECK(max_abs(difference(round_trip, input)) < 1e-14);
  }
}

TEST_CASE("rope works in place (output aliasing input)") {
  const RopeShape shape;
  const auto input = random_values(count(shape), 47);
  const auto reference = run_forward<double>(input, shape);
  const auto [cos, sin] = tables<double>(shape);
  auto values = input;
  backend::cpu::rope_forward(values.data(), values.data(), cos.data(), sin.data(), kRopeBatch, kRopeSeq,
                             kHeads, kHeadDim, kHeadDim, shape.row_stride);
  CHECK(values == reference);
  backend::cpu::rope_backward(values.data(), values.data(), cos.data(), sin.data(), kRopeBatch, kRopeSeq,
                              kHeads, kHeadDim, kHeadDim, shape.row_stride);
  CHECK(values == run_backward<double>(reference, shape));
}

TEST_CASE("rope in float matches double") {
  const RopeShape shape{.rotary_dim = 6, .row_stride = kHeads * kHeadDim, .seq_length = kRopeSeq};
  const auto input = random_values(count(shape), 48);
  CHECK(error_relative_to_max(run_forward<float>(input, shape), run_forward<double>(input, shape)) <
        1e-6);
  CHECK(error_relative_to_max(run_backward<float>(input, shape),
                              run_backward<double>(input, shape)) < 1e-6);
}

TEST_CASE("rope gives the same bits on every thread count") {
  constexpr int64_t batch = 4, seq = 64, heads = 8, head_dim = 64;
  const auto input = random_values(static_cast<size_t>(batch * seq * heads * head_dim), 49);
  auto run = [&] {
    std::vector<double> cos(seq * head_dim / 2), sin(cos.size());
    backend::cpu::rope_tables(cos.data(), sin.data(), seq, head_dim, kBase, {});
    std::vector<double> output(input.size()), dinput(input.size());
    backend::cpu::rope_forward(output.data(), input.data(), cos.data(), sin.data(), batch, seq,
                               heads, head_dim, head_dim, heads * head_dim);
    backend::cpu::rope_backward(dinput.data(), input.data(), cos.data(), sin.data(), batch, seq,
                                heads, head_dim, head_dim, heads * head_dim);
    output.insert(output.end(), dinput.begin(), dinput.end());
    return output;
  };
  const auto [serial, parallel] = on_one_and_three_threads(run);
  CHECK(serial == parallel);
}

TEST_CASE("rope at positions of their own is rope_forward's rows, in any order") {
  const int64_t batch = 2, seq = 6, heads = 3, head_dim = 8, rotary_dim = 4;
  const int64_t row_stride = heads * head_dim + 3;
  const int64_t rows = batch * seq;
  std::vector<double> cos(static_cast<size_t>(seq * rotary_dim / 2));
  std::vector<double> sin(cos.size());
  backend::cpu::rope_tables(cos.data(), sin.data(), seq, rotary_dim, 10000.0, {});
  const auto input = backend::testing::random_values(static_cast<size_t>(rows * row_stride), 94);
  std::vector<double> whole(input.size(), 0.0);
  backend::cpu::rope_forward(whole.data(), input.data(), cos.data(), sin.data(), batch, seq, heads,
                             head_dim, rotary_dim, row_stride);
  // The rows reversed, each at its own position.
  std::vector<double> reversed_input;
  std::vector<int32_t> positions;
  for (int64_t r = rows - 1; r >= 0; --r) {
    reversed_input.insert(reversed_input.end(), input.begin() + r * row_stride,
                          input.begin() + (r + 1) * row_stride);
    positions.push_back(static_cast<int32_t>(r % seq));
  }
  std::vector<double> reversed(input.size(), 0.0);
  backend::cpu::rope_at_positions_forward(reversed.data(), reversed_input.data(), cos.data(),
                                          sin.data(), positions.data(), rows, heads, head_dim,
                                          rotary_dim, row_stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < heads * head_dim; ++c) {
      CHECK(reversed[static_cast<size_t>((rows - 1 - r) * row_stride + c)] ==
            whole[static_cast<size_t>(r * row_stride + c)]);
    }
  }
}

TEST_CASE("rope tables with Llama 3's scaling: kept, interpolated and divided frequencies") {
  // Head size 8, base 10000: wavelengths 2π·10^(4i/4·... ) = 6.28, 62.8, 628, 6283 for i = 0..3.
  // With an original length of 64 (bands at 64 / 4 = 16 and 64 / 1 = 64): i = 0 is kept, i = 1
  // interpolated, i = 2 and 3 divided by the factor.
  const backend::RopeScaling scaling{.factor = 8,
                                     .low_frequency_factor = 1,
                                     .high_frequency_factor = 4,
                                     .original_max_position_embeddings = 64};
  const int64_t seq = 6, rotary_dim = 8, half = rotary_dim / 2;
  std::vector<double> expected_frequency(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    expected_frequency[i] = 1.0 / std::pow(kBase, static_cast<double>(2 * i) / rotary_dim);
  }
  const double wavelength = 2 * M_PI / expected_frequency[1];
  const double smooth = (64 / wavelength - 1) / (4 - 1);  // in (0, 1): the middle band
  CHECK(smooth > 0);
  CHECK(smooth < 1);
  expected_frequency[1] = (1 - smooth) * expected_frequency[1] / 8 + smooth * expected_frequency[1];
  expected_frequency[2] /= 8;
  expected_frequency[3] /= 8;
  std::vector<double> cos(static_cast<size_t>(seq * half)), sin(cos.size());
  backend::cpu::rope_tables(cos.data(), sin.data(), seq, rotary_dim, kBase, scaling);
  std::vector<double> plain_cos(cos.size()), plain_sin(cos.size());
  backend::cpu::rope_tables(plain_cos.data(), plain_sin.data(), seq, rotary_dim, kBase, {});
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      CAPTURE(t);
      CAPTURE(i);
      const double angle = static_cast<double>(t) * expected_frequency[i];
      CHECK(cos[t * half + i] == doctest::Approx(std::cos(angle)).epsilon(1e-14));
      CHECK(sin[t * half + i] == doctest::Approx(std::sin(angle)).epsilon(1e-14));
      if (t > 0 && i == 0) CHECK(sin[t * half + i] == plain_sin[t * half + i]);
      if (t > 0 && i > 0) CHECK(sin[t * half + i] != plain_sin[t * half + i]);
    }
  }
  // No scaling is the identity, at compile time too (the CUDA kernel's use).
  static_assert(backend::scaled_inverse_frequency(0.25, backend::RopeScaling{}) == 0.25);
  static_assert(backend::scaled_inverse_frequency(1e-6, backend::RopeScaling{.factor = 8}) ==
                1e-6 / 8);
}
