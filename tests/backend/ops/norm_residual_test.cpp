// The residual connection fused with the next norm (norm_kind.hpp's ResidualAdd and
// InputGradient, in layernorm.hpp and rmsnorm.hpp): forward, sum = residual + branch and the
// norm of it in one call, and backward, the norm's input gradient added to the residual
// stream's, give the same bits as the two separate ops they replace in the model (residual then
// norm; norm then residual), for LayerNorm (with and without the 1p offset) and RMSNorm, fp32
// and fp64. The refusals of a sum that is one of its operands, or of another extent.
#include <doctest/doctest.h>

#include <span>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/ops/layernorm.hpp"
#include "backend/ops/residual.hpp"
#include "backend/ops/rmsnorm.hpp"
#include "tests/backend/ops/gradient_check.hpp"

using namespace backend::testing;
using backend::View;

namespace {

template <typename Scalar>
View view_of(std::vector<Scalar>& values) {
  return backend::host_view(std::span<Scalar>(values));
}

template <typename Scalar>
void check_fused_norm(backend::NormKind kind, double offset) {
  backend::CpuDevice device;
  constexpr int64_t rows = 37, channels = 48;  // more rows than one thread's share
  const int64_t n = rows * channels;
  auto residual = convert<Scalar>(random_values(n, 71));
  auto branch = convert<Scalar>(random_values(n, 72));
  auto weight = convert<Scalar>(random_values(channels, 73));
  auto bias = convert<Scalar>(random_values(channels, 74));
  auto doutput = convert<Scalar>(random_values(n, 75));
  auto stream_gradient = convert<Scalar>(random_values(n, 76));
  const bool layer_norm = kind == backend::NormKind::layer_norm;

  struct Result {
    std::vector<Scalar> sum, output, mean, rstd, dstream, dweight, dbias;
  };
  auto run = [&](bool fused) {
    Result r{std::vector<Scalar>(n),       std::vector<Scalar>(n), std::vector<Scalar>(rows),
             std::vector<Scalar>(rows),    stream_gradient,        std::vector<Scalar>(channels),
             std::vector<Scalar>(channels)};
    std::vector<Scalar> dnorm(n);
    const backend::ResidualViews add =
        fused ? backend::ResidualViews{view_of(residual), view_of(branch)}
              : backend::ResidualViews{};
    if (!fused) {
      backend::ops::residual_forward(device, view_of(r.sum), view_of(residual), view_of(branch));
    }
    const auto mode =
        fused ? backend::InputGradient::accumulate : backend::InputGradient::overwrite;
    View dinput = fused ? view_of(r.dstream) : view_of(dnorm);
    if (layer_norm) {
      backend::ops::layernorm_forward(device, view_of(r.output), view_of(r.mean), view_of(r.rstd),
                                      view_of(r.sum), view_of(weight), view_of(bias), offset, 1e-5,
                                      rows, channels, add);
      backend::ops::layernorm_backward(device, dinput, view_of(r.dweight), view_of(r.dbias),
                                       view_of(doutput), view_of(r.sum), view_of(weight), offset,
                                       view_of(r.mean), view_of(r.rstd), rows, channels, mode);
    } else {
      backend::ops::rmsnorm_forward(device, view_of(r.output), view_of(r.rstd), view_of(r.sum),
                                    view_of(weight), 1e-5, rows, channels, add);
      backend::ops::rmsnorm_backward(device, dinput, view_of(r.dweight), view_of(doutput),
                                     view_of(r.sum), view_of(weight), view_of(r.rstd), rows,
                                     channels, mode);
    }
    if (!fused) {
      backend::ops::residual_forward(device, view_of(r.dstream), view_of(r.dstream),
                                     view_of(dnorm));
    }
    return r;
  };
  const Result separate = run(false);
  const Result fused = run(true);
  CHECK(fused.sum == separate.sum);
  CHECK(fused.output == separate.output);
  CHECK(fused.rstd == separate.rstd);
  if (layer_norm) CHECK(fused.mean == separate.mean);
  CHECK(fused.dstream == separate.dstream);
  CHECK(fused.dweight == separate.dweight);
  if (layer_norm) CHECK(fused.dbias == separate.dbias);
  CHECK(fused.dstream != stream_gradient);  // the norm's gradient was added
}

}  // namespace

TEST_CASE("a norm fused with the residual connection gives the bits of the two separate ops") {
  check_fused_norm<float>(backend::NormKind::layer_norm, 0.0);
  check_fused_norm<float>(backend::NormKind::layer_norm, 1.0);
  check_fused_norm<double>(backend::NormKind::layer_norm, 0.0);
  check_fused_norm<float>(backend::NormKind::rms_norm, 0.0);
  check_fused_norm<double>(backend::NormKind::rms_norm, 0.0);
}

TEST_CASE(
    "a fused residual connection refuses a sum that is one of its operands, or of another "
    "extent") {
  backend::CpuDevice device;
  constexpr int64_t rows = 2, channels = 8;
  std::vector<float> x(rows * channels, 1.0f), b(rows * channels, 2.0f), y(rows * channels),
      rstd(rows), weight(channels, 1.0f), short_branch(channels);
  CHECK_THROWS_WITH_AS(
      backend::ops::rmsnorm_forward(device, view_of(y), view_of(rstd), view_of(x), view_of(weight),
                                    1e-5, rows, channels, {view_of(x), view_of(b)}),
      doctest::Contains("other memory than its operands"), common::Error);
  std::vector<float> sum(rows * channels);
  CHECK_THROWS_AS(backend::ops::rmsnorm_forward(device, view_of(y), view_of(rstd), view_of(sum),
                                                view_of(weight), 1e-5, rows, channels,
                                                {view_of(x), view_of(short_branch)}),
                  common::Error);
}
