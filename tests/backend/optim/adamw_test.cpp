// AdamW and global-norm clipping against the formulas written out in double; the norm's
// fixed summation order (the same bits on any thread count).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backend/optim/adamw.hpp"
#include "tests/backend/ops/gradient_check.hpp"

using namespace backend;

TEST_CASE("two AdamW steps match torch.optim.AdamW's update written out in double") {
  const AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<float> parameters = {0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<std::vector<float>> gradients = {{0.1f, -0.2f, 0.3f, 0.0f},
                                                     {-0.05f, 0.4f, 0.1f, 1.0f}};
  // Elements 0..1 decay, 2..3 do not (a bias or norm weight).
  AdamW optimizer(config, {{0, 2, true}, {2, 2, false}}, 4);
  std::vector<double> p(parameters.begin(), parameters.end()), m(4, 0), v(4, 0);
  const double lr = 1e-2;
  for (int step = 1; step <= 2; ++step) {
    optimizer.step(parameters, gradients[step - 1], lr);
    for (int i = 0; i < 4; ++i) {
      const double g = gradients[step - 1][i];
      const double decay = i < 2 ? config.weight_decay : 0.0;
      p[i] *= 1 - lr * decay;
      m[i] = config.beta1 * m[i] + (1 - config.beta1) * g;
      v[i] = config.beta2 * v[i] + (1 - config.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(config.beta1, step));
      const double v_hat = v[i] / (1 - std::pow(config.beta2, step));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + config.eps);
    }
  }
  for (int i = 0; i < 4; ++i) CHECK(parameters[i] == doctest::Approx(p[i]).epsilon(1e-6));
  CHECK(optimizer.steps_taken() == 2);
}

TEST_CASE("gradient norm and clipping follow Megatron's clip_grad_norm") {
  std::vector<float> gradients = {3.0f, 4.0f};
  const double norm = global_gradient_norm(gradients);
  CHECK(norm == doctest::Approx(5.0));
  clip_gradients(gradients, norm, 10.0);  // under the limit: unchanged
  CHECK(gradients[0] == 3.0f);
  clip_gradients(gradients, norm, 1.0);
  CHECK(gradients[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(global_gradient_norm(gradients) == doctest::Approx(1.0).epsilon(1e-5));
  std::vector<float> unclipped = {3.0f, 4.0f};
  clip_gradients(unclipped, 5.0, 0.0);  // max_norm 0 disables clipping
  CHECK(unclipped[1] == 4.0f);
}

TEST_CASE("the gradient norm does not depend on how the buffer is chunked") {
  std::vector<float> gradients(300000);
  for (size_t i = 0; i < gradients.size(); ++i) gradients[i] = std::sin(static_cast<float>(i));
  double expected = 0;
  for (float g : gradients) expected += static_cast<double>(g) * g;
  CHECK(global_gradient_norm(gradients) == doctest::Approx(std::sqrt(expected)).epsilon(1e-12));
}

TEST_CASE("the gradient norm is the same on one thread and on three") {
  // Several chunks of 65536 and a remainder that is not a whole number of lanes.
  std::vector<float> gradients(3 * 65536 + 1001);
  for (size_t i = 0; i < gradients.size(); ++i) {
    gradients[i] = std::sin(static_cast<float>(i) * 0.37f) * (1.0f + static_cast<float>(i % 7));
  }
  const auto [serial, parallel] =
      backend::testing::on_one_and_three_threads([&] { return global_gradient_norm(gradients); });
  CHECK(serial == parallel);
  double expected = 0;
  for (float g : gradients) expected += static_cast<double>(g) * g;
  CHECK(serial == doctest::Approx(std::sqrt(expected)).epsilon(1e-12));
}
