// linear_gelu_forward / linear_dgelu_backward: the CPU twin is linear's and gelu's twins in
// turn, bit for bit (with and without a bias, fp32 and fp64), and the pair is the MLP's
// gradient: the backward against central finite differences of a loss through fc1, GELU and
// fc2 in double.
#include "backend/ops/linear_gelu.hpp"

#include <doctest/doctest.h>

#include "backend/ops/gelu.hpp"
#include "backend/ops/linear.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kMlpRows = 6;
constexpr int64_t kMlpHidden = 5;    // C
constexpr int64_t kMlpFeatures = 9;  // F

}  // namespace

TEST_CASE("linear_gelu gives the bits of linear then gelu, forward and backward") {
  for (const bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    auto check = [&](auto zero) {
      using Scalar = decltype(zero);
      const auto x = convert<Scalar>(random_values(kMlpRows * kMlpHidden, 71));
      const auto w1 = convert<Scalar>(random_values(kMlpFeatures * kMlpHidden, 72));
      const auto b1 = convert<Scalar>(random_values(kMlpFeatures, 73));
      const auto w2 = convert<Scalar>(random_values(kMlpHidden * kMlpFeatures, 74));
      const auto dy = convert<Scalar>(random_values(kMlpRows * kMlpHidden, 75));
      const Scalar* bias = with_bias ? b1.data() : nullptr;
      // Separately.
      std::vector<Scalar> h(kMlpRows * kMlpFeatures), a(kMlpRows * kMlpFeatures);
      backend::cpu::linear_forward(h.data(), x.data(), w1.data(), bias, kMlpRows, kMlpHidden,
                                   kMlpFeatures);
      backend::cpu::gelu_forward(a.data(), h.data(), kMlpRows * kMlpFeatures);
      std::vector<Scalar> da(kMlpRows * kMlpFeatures), dh(kMlpRows * kMlpFeatures);
      auto dw2 = convert<Scalar>(random_values(kMlpHidden * kMlpFeatures, 76));  // accumulates
      auto db2 = convert<Scalar>(random_values(kMlpHidden, 77));
      backend::cpu::linear_backward(da.data(), dw2.data(), db2.data(), dy.data(), a.data(),
                                    w2.data(), kMlpRows, kMlpFeatures, kMlpHidden);
      backend::cpu::gelu_backward(dh.data(), da.data(), h.data(), kMlpRows * kMlpFeatures);
      // Fused.
      std::vector<Scalar> fused_h(kMlpRows * kMlpFeatures, Scalar{1000});
      std::vector<Scalar> fused_a(kMlpRows * kMlpFeatures, Scalar{1000});
      backend::cpu::linear_gelu_forward(fused_a.data(), fused_h.data(), x.data(), w1.data(), bias,
                                        kMlpRows, kMlpHidden, kMlpFeatures);
      CHECK(fused_h == h);
      CHECK(fused_a == a);
      std::vector<Scalar> fused_dh(kMlpRows * kMlpFeatures, Scalar{1000});
      auto fused_dw2 = convert<Scalar>(random_values(kMlpHidden * kMlpFeatures, 76));
      auto fused_db2 = convert<Scalar>(random_values(kMlpHidden, 77));
      backend::cpu::linear_dgelu_backward(fused_dh.data(), fused_dw2.data(), fused_db2.data(),
                                          dy.data(), a.data(), w2.data(), h.data(), kMlpRows,
                                          kMlpFeatures, kMlpHidden);
      CHECK(fused_dh == dh);
      CHECK(fused_dw2 == dw2);
      CHECK(fused_db2 == db2);
    };
    check(0.0f);
    check(0.0);
  }
}

TEST_CASE("linear_dgelu_backward is the gradient through fc1, GELU and fc2 (finite differences)") {
  // loss = Σ dy ∘ (GELU(x · W1ᵀ + b1) · W2ᵀ): dh from the fused backward, then fc1's backward
  // gives d loss / dx, checked against central differences.
  auto x = random_values(kMlpRows * kMlpHidden, 81);
  const auto w1 = random_values(kMlpFeatures * kMlpHidden, 82);
  const auto b1 = random_values(kMlpFeatures, 83);
  const auto w2 = random_values(kMlpHidden * kMlpFeatures, 84);
  const auto dy = random_values(kMlpRows * kMlpHidden, 85);
  auto loss = [&](const std::vector<double>& input) {
    std::vector<double> h(kMlpRows * kMlpFeatures), a(kMlpRows * kMlpFeatures),
        y(kMlpRows * kMlpHidden);
    backend::cpu::linear_gelu_forward(a.data(), h.data(), input.data(), w1.data(), b1.data(),
                                      kMlpRows, kMlpHidden, kMlpFeatures);
    backend::cpu::linear_forward(y.data(), a.data(), w2.data(), nullptr, kMlpRows, kMlpFeatures,
                                 kMlpHidden);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += dy[i] * y[i];
    return sum;
  };
  std::vector<double> h(kMlpRows * kMlpFeatures), a(kMlpRows * kMlpFeatures),
      dh(kMlpRows * kMlpFeatures);
  backend::cpu::linear_gelu_forward(a.data(), h.data(), x.data(), w1.data(), b1.data(), kMlpRows,
                                    kMlpHidden, kMlpFeatures);
  std::vector<double> dw2(kMlpHidden * kMlpFeatures, 0.0), dw1(kMlpFeatures * kMlpHidden, 0.0);
  backend::cpu::linear_dgelu_backward(dh.data(), dw2.data(), static_cast<double*>(nullptr),
                                      dy.data(), a.data(), w2.data(), h.data(), kMlpRows,
                                      kMlpFeatures, kMlpHidden);
  std::vector<double> dx(kMlpRows * kMlpHidden);
  backend::cpu::linear_backward(dx.data(), dw1.data(), static_cast<double*>(nullptr), dh.data(),
                                x.data(), w1.data(), kMlpRows, kMlpHidden, kMlpFeatures);
  const double step = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    const double saved = x[i];
    x[i] = saved + step;
    const double up = loss(x);
    x[i] = saved - step;
    const double down = loss(x);
    x[i] = saved;
    CHECK(dx[i] == doctest::Approx((up - down) / (2 * step)).epsilon(1e-6));
  }
}
