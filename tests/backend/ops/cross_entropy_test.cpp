// cross_entropy_forward / cross_entropy_backward: forward against the direct formula (and
// stability on large logits), backward against central finite differences of the mean loss
// in double, in place, float against double; the vocabulary-parallel partial, combine and
// shard backward against the whole vocabulary's op; ignored labels (kIgnoredLabel) in each; the
// fused forward-backward against the separate ops, bit for bit.
#include "backend/ops/cross_entropy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "tests/backend/ops/gradient_check.hpp"

namespace {

using namespace backend::testing;

constexpr int64_t kLossRows = 5;
constexpr int64_t kLossVocab = 11;

struct CrossEntropyCase {
  std::vector<double> logits = random_values(kLossRows * kLossVocab, 51, 3.0);
  std::vector<int32_t> labels = random_ids(kLossRows, kLossVocab, 52);
  double scale = 1.0 / kLossRows;  // gradient of the mean
};

struct CrossEntropyResult {
  std::vector<double> losses, logsumexp, dlogits;
};

template <typename Scalar>
CrossEntropyResult run_cross_entropy(const CrossEntropyCase& c) {
  const auto logits = convert<Scalar>(c.logits);
  std::vector<Scalar> losses(kLossRows), logsumexp(kLossRows);
  std::vector<Scalar> dlogits(kLossRows * kLossVocab, Scalar{1000});  // must be overwritten
  backend::cpu::cross_entropy_forward(losses.data(), logsumexp.data(), logits.data(),
                                      c.labels.data(), kLossRows, kLossVocab);
  backend::cpu::cross_entropy_backward(dlogits.data(), logits.data(), logsumexp.data(),
                                       c.labels.data(), static_cast<Scalar>(c.scale), kLossRows,
                                       kLossVocab, 0);
  return {convert<double>(losses), convert<double>(logsumexp), convert<double>(dlogits)};
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value;
  return sum / static_cast<double>(values.size());
}

}  // namespace

TEST_CASE("cross entropy forward is logsumexp minus the label's logit") {
  CrossEntropyCase c;
  const CrossEntropyResult result = run_cross_entropy<double>(c);
  for (int64_t r = 0; r < kLossRows; ++r) {
    double sum = 0;
    for (int64_t v = 0; v < kLossVocab; ++v) sum += std::exp(c.logits[r * kLossVocab + v]);
    CHECK(result.logsumexp[r] == doctest::Approx(std::log(sum)).epsilon(1e-13));
    const double probability = std::exp(c.logits[r * kLossVocab + c.labels[r]]) / sum;
    CHECK(result.losses[r] == doctest::Approx(-std::log(probability)).epsilon(1e-13));
  }
}

TEST_CASE("cross entropy stays finite on large logits") {
  // exp(1000) overflows; the max-shifted logsumexp does not.
  std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  const std::vector<int32_t> labels = {1};
  float loss = 0;
  float logsumexp = 0;
  backend::cpu::cross_entropy_forward(&loss, &logsumexp, logits.data(), labels.data(), 1, 3);
  // float resolves 1000 + 0.31 to about 6e-5, hence the tolerance.
  CHECK(loss == doctest::Approx(1.0 + std::log1p(std::exp(-1.0))).epsilon(1e-4));
  std::vector<float> dlogits(3);
  backend::cpu::cross_entropy_backward(dlogits.data(), logits.data(), &logsumexp, labels.data(),
                                       1.0f, 1, 3, 0);
  CHECK(dlogits[0] == doctest::Approx(1 / (1 + std::exp(-1.0))).epsilon(1e-4));
  CHECK(dlogits[1] == doctest::Approx(1 / (1 + std::exp(1.0)) - 1).epsilon(1e-4));
  CHECK(dlogits[2] == 0.0f);
}

TEST_CASE("cross entropy backward matches central finite differences of the mean loss") {
  CrossEntropyCase c;
  const CrossEntropyResult result = run_cross_entropy<double>(c);
  std::vector<double> losses(kLossRows), logsumexp(kLossRows);
  auto loss = [&] {
    backend::cpu::cross_entropy_forward(losses.data(), logsumexp.data(), c.logits.data(),
                                        c.labels.data(), kLossRows, kLossVocab);
    return mean(losses);
  };
  BACKEND_CHECK_GRADIENT(check_gradient(c.logits, result.dlogits, loss), 1e-6);
}

TEST_CASE("cross entropy backward scales and works in place") {
  CrossEntropyCase c;
  const CrossEntropyResult reference = run_cross_entropy<double>(c);
  auto gradient = c.logits;  // dlogits aliasing logits
  backend::cpu::cross_entropy_backward(gradient.data(), gradient.data(), reference.logsumexp.data(),
                                       c.labels.data(), 4 * c.scale, kLossRows, kLossVocab, 0);
  for (size_t i = 0; i < gradient.size(); ++i) CHECK(gradient[i] == 4 * reference.dlogits[i]);
}

TEST_CASE("cross entropy in float matches double") {
  CrossEntropyCase c;
  const CrossEntropyResult single = run_cross_entropy<float>(c);
  const CrossEntropyResult reference = run_cross_entropy<double>(c);
  CHECK(error_relative_to_max(single.losses, reference.losses) < 1e-6);
  CHECK(error_relative_to_max(single.dlogits, reference.dlogits) < 1e-6);
}

namespace {

// A vocabulary of whole 16-lane groups plus a remainder, as the padded 50304 is not.
constexpr int64_t kWideRows = 6;
constexpr int64_t kWideVocab = 4103;

template <typename Scalar>
std::pair<std::vector<double>, std::vector<double>> run_wide(const std::vector<double>& values,
                                                             const std::vector<int32_t>& labels) {
  const auto logits = convert<Scalar>(values);
  std::vector<Scalar> losses(kWideRows), logsumexp(kWideRows), dlogits(logits.size());
  backend::cpu::cross_entropy_forward(losses.data(), logsumexp.data(), logits.data(),
                                      labels.data(), kWideRows, kWideVocab);
  backend::cpu::cross_entropy_backward(dlogits.data(), logits.data(), logsumexp.data(),
                                       labels.data(), Scalar{1} / kWideRows, kWideRows,
                                       kWideVocab, 0);
  return {convert<double>(losses), convert<double>(dlogits)};
}

}  // namespace

TEST_CASE("cross entropy in float matches double over a wide vocabulary") {
  // The float path's vectorised exponentials and lane sums against std::exp in double; one
  // row with logits in the hundreds, where the shift by the maximum matters.
  auto values = random_values(kWideRows * kWideVocab, 53, 8.0);
  for (int64_t v = 0; v < kWideVocab; ++v) values[static_cast<size_t>(v)] *= 60;
  const auto labels = random_ids(kWideRows, kWideVocab, 54);
  const auto single = run_wide<float>(values, labels);
  const auto reference = run_wide<double>(values, labels);
  for (int64_t r = 0; r < kWideRows; ++r) {
    INFO("row " << r);
    // The loss in float carries the rounding of the logits it subtracts (up to 480 here).
    CHECK(single.first[r] == doctest::Approx(reference.first[r]).epsilon(2e-6).scale(
                                 std::abs(values[static_cast<size_t>(r * kWideVocab)]) + 1));
    const auto row = [&](const std::vector<double>& all) {
      return std::vector<double>(all.begin() + r * kWideVocab, all.begin() + (r + 1) * kWideVocab);
    };
    CHECK(error_relative_to_max(row(single.second), row(reference.second)) < 1e-5);
  }
  for (const double loss : single.first) CHECK(std::isfinite(loss));
}

TEST_CASE("cross entropy gives the same bits on one thread and on three") {
  const auto values = random_values(kWideRows * kWideVocab, 55, 5.0);
  const auto labels = random_ids(kWideRows, kWideVocab, 56);
  const auto [serial, parallel] = on_one_and_three_threads([&] { return run_wide<float>(values, labels); });
  CHECK(serial.first == parallel.first);
  CHECK(serial.second == parallel.second);
}

namespace {

// What P vocabulary shards compute for the rows of (rows, vocab) logits: each shard's partial
// on its columns (shard k: [k·V/P, (k+1)·V/P), unequal when P does not divide V), the
// all-gather (part-major) and the sum of the target logits done here as the caller does, then
// the combine; and each shard's backward with the given global logsumexp, its columns put
// back in place.
template <typename Scalar>
struct ShardedCrossEntropy {
  std::vector<Scalar> losses, logsumexp, dlogits;
};

template <typename Scalar>
ShardedCrossEntropy<Scalar> run_sharded(const std::vector<Scalar>& logits,
                                        const std::vector<int32_t>& labels, int64_t rows,
                                        int64_t vocab, int64_t parts,
                                        const std::vector<Scalar>& global_logsumexp, Scalar scale) {
  std::vector<Scalar> gathered(parts * rows), target(rows, Scalar{0});
  ShardedCrossEntropy<Scalar> result{std::vector<Scalar>(rows), std::vector<Scalar>(rows),
                                     std::vector<Scalar>(rows * vocab)};
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t begin = k * vocab / parts;
    const int64_t width = (k + 1) * vocab / parts - begin;
    std::vector<Scalar> shard(rows * width);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(logits.begin() + r * vocab + begin, width, shard.begin() + r * width);
    }
    std::vector<Scalar> part(rows, Scalar{1000}), target_part(rows, Scalar{1000});
    backend::cpu::vocab_parallel_cross_entropy_partial(
        part.data(), target_part.data(), shard.data(), labels.data(), rows, width, begin);
    std::copy(part.begin(), part.end(), gathered.begin() + k * rows);
    for (int64_t r = 0; r < rows; ++r) target[r] += target_part[r];

    std::vector<Scalar> dshard(rows * width, Scalar{1000});
    backend::cpu::cross_entropy_backward(dshard.data(), shard.data(), global_logsumexp.data(),
                                         labels.data(), scale, rows, width, begin);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(dshard.begin() + r * width, width, result.dlogits.begin() + r * vocab + begin);
    }
  }
  backend::cpu::vocab_parallel_cross_entropy_combine(result.losses.data(), result.logsumexp.data(),
                                                     gathered.data(), target.data(),
                                                     labels.data(), rows, parts);
  return result;
}

}  // namespace

TEST_CASE("vocabulary-parallel cross entropy over 1, 2 and 3 shards is the whole op's") {
  CrossEntropyCase c;
  const CrossEntropyResult full = run_cross_entropy<double>(c);
  for (const int64_t parts : {1, 2, 3}) {
    CAPTURE(parts);
    const auto sharded =
        run_sharded<double>(c.logits, c.labels, kLossRows, kLossVocab, parts, full.logsumexp, c.scale);
    for (int64_t r = 0; r < kLossRows; ++r) {
      CAPTURE(r);
      if (parts == 1) {
        // m + log(exp(0)) = m: one part is the forward, bit for bit.
        CHECK(sharded.logsumexp[r] == full.logsumexp[r]);
        CHECK(sharded.losses[r] == full.losses[r]);
      } else {
        CHECK(std::abs(sharded.logsumexp[r] - full.logsumexp[r]) <=
              1e-12 * std::abs(full.logsumexp[r]));
        CHECK(std::abs(sharded.losses[r] - full.losses[r]) <= 1e-12 * std::abs(full.losses[r]));
      }
    }
    // Each element of the backward needs the global logsumexp only: the same bits.
    CHECK(sharded.dlogits == full.dlogits);
  }
}

TEST_CASE("one vocabulary-parallel part reproduces the float forward bit for bit") {
  // The float path's vectorised row reduction over a wide vocabulary: the partial takes the
  // forward's, and the combine's exp(0) = 1, log 1 = 0 pass it through.
  const auto logits = convert<float>(random_values(kWideRows * kWideVocab, 57, 6.0));
  const auto labels = random_ids(kWideRows, kWideVocab, 58);
  std::vector<float> losses(kWideRows), logsumexp(kWideRows);
  backend::cpu::cross_entropy_forward(losses.data(), logsumexp.data(), logits.data(), labels.data(),
                                      kWideRows, kWideVocab);
  const auto sharded =
      run_sharded<float>(logits, labels, kWideRows, kWideVocab, 1, logsumexp, 1.0f / kWideRows);
  CHECK(sharded.losses == losses);
  CHECK(sharded.logsumexp == logsumexp);
  std::vector<float> dlogits(logits.size());
  backend::cpu::cross_entropy_backward(dlogits.data(), logits.data(), logsumexp.data(),
                                       labels.data(), 1.0f / kWideRows, kWideRows, kWideVocab, 0);
  CHECK(sharded.dlogits == dlogits);
}

TEST_CASE("a shard without the label has target logit 0 and leaves its gradient unshifted") {
  const std::vector<double> logits = {0.5, -1.0, 2.0};  // columns 4, 5, 6 of a vocabulary
  const std::vector<int32_t> labels = {1};              // on another shard
  double part = 0, target = 1000;
  backend::cpu::vocab_parallel_cross_entropy_partial(&part, &target, logits.data(), labels.data(),
                                                     1, 3, 4);
  CHECK(target == 0.0);
  CHECK(part == doctest::Approx(std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0))));
  const double global = 3.0;
  std::vector<double> dlogits(3);
  backend::cpu::cross_entropy_backward(dlogits.data(), logits.data(), &global, labels.data(), 0.5,
                                       1, 3, 4);
  for (int64_t v = 0; v < 3; ++v) CHECK(dlogits[v] == std::exp(logits[v] - global) * 0.5);
  // The label's shard: column 1 of [0, 3).
  const std::vector<int32_t> here = {5};
  backend::cpu::vocab_parallel_cross_entropy_partial(&part, &target, logits.data(), here.data(), 1,
                                                     3, 4);
  CHECK(target == -1.0);
}

TEST_CASE("an ignored label gives loss 0 and a zero gradient row, whole and sharded, the rest unchanged") {
  CrossEntropyCase c;
  const CrossEntropyResult scored = run_cross_entropy<double>(c);
  CrossEntropyCase ignored_case = c;
  const int64_t ignored_rows[] = {1, 3};
  for (const int64_t r : ignored_rows) ignored_case.labels[r] = backend::kIgnoredLabel;
  auto is_ignored = [&](int64_t r) { return r == 1 || r == 3; };
  for (const bool in_float : {false, true}) {
    CAPTURE(in_float);
    const CrossEntropyResult whole = in_float ? run_cross_entropy<float>(ignored_case)
                                              : run_cross_entropy<double>(ignored_case);
    const CrossEntropyResult reference = in_float ? run_cross_entropy<float>(c) : scored;
    for (int64_t r = 0; r < kLossRows; ++r) {
      CAPTURE(r);
      const auto row = [&](const CrossEntropyResult& result) {
        return std::vector<double>(result.dlogits.begin() + r * kLossVocab,
                                   result.dlogits.begin() + (r + 1) * kLossVocab);
      };
      if (is_ignored(r)) {
        CHECK(whole.losses[r] == 0.0);
        CHECK(row(whole) == std::vector<double>(kLossVocab, 0.0));
      } else {
        CHECK(whole.losses[r] == reference.losses[r]);
        CHECK(row(whole) == row(reference));
      }
      CHECK(whole.logsumexp[r] == reference.logsumexp[r]);
    }
  }
  const CrossEntropyResult whole = run_cross_entropy<double>(ignored_case);
  for (const int64_t parts : {1, 2, 3}) {
    CAPTURE(parts);
    const auto sharded = run_sharded<double>(c.logits, ignored_case.labels, kLossRows, kLossVocab,
                                             parts, whole.logsumexp, c.scale);
    for (const int64_t r : ignored_rows) CHECK(sharded.losses[r] == 0.0);
    CHECK(sharded.dlogits == whole.dlogits);
  }
}

TEST_CASE("the fused classifier gives the separate forward's and backward's bits in place") {
  // Narrow and wide rows (the float path's vector loops and lane sums), ignored rows included.
  for (const int64_t vocab : {kLossVocab, int64_t{1000}}) {
    CAPTURE(vocab);
    const int64_t rows = 4;
    const auto logits = random_values(rows * vocab, 53, 4.0);
    auto labels = random_ids(rows, static_cast<int32_t>(vocab), 54);
    labels[2] = backend::kIgnoredLabel;
    auto check = [&](auto zero) {
      using Scalar = decltype(zero);
      const auto z = convert<Scalar>(logits);
      const auto scale = static_cast<Scalar>(0.375);
      std::vector<Scalar> losses(rows), logsumexp(rows), dlogits(z.size(), Scalar{1000});
      backend::cpu::cross_entropy_forward(losses.data(), logsumexp.data(), z.data(), labels.data(),
                                          rows, vocab);
      backend::cpu::cross_entropy_backward(dlogits.data(), z.data(), logsumexp.data(),
                                           labels.data(), scale, rows, vocab, 0);
      std::vector<Scalar> fused_losses(rows, Scalar{-1}), fused_logsumexp(rows, Scalar{-1});
      auto in_place = z;
      backend::cpu::cross_entropy_forward_backward(fused_losses.data(), fused_logsumexp.data(),
                                                   in_place.data(), labels.data(), scale, rows,
                                                   vocab);
      CHECK(fused_losses == losses);
      CHECK(fused_logsumexp == logsumexp);
      CHECK(in_place == dlogits);
      CHECK(fused_losses[2] == Scalar{0});
    };
    check(0.0f);
    check(0.0);
  }
}

TEST_CASE("the vocabulary shard's backward reads a stored scale when it runs") {
  // Tensor parallelism's classifier backward in a captured step: the scale staged per micro
  // batch, as the fused classifier's.
  backend::CpuDevice device;
  const int64_t rows = 3, width = 40, begin = 40;
  const auto logits = convert<float>(random_values(rows * width, 57, 2.0));
  const auto labels = random_ids(rows, static_cast<int32_t>(2 * width), 58);
  std::vector<float> logsumexp = {1.5f, 2.0f, 2.5f};
  auto run = [&](double scale, double* stored) {
    std::vector<float> dlogits(static_cast<size_t>(rows * width));
    auto in = logits;
    auto lse = logsumexp;
    auto ids = labels;
    backend::ops::cross_entropy_backward(
        device, backend::host_view(std::span(dlogits)), backend::host_view(std::span(in)),
        backend::host_view(std::span(lse)), backend::host_view(std::span(ids)), scale, rows, width,
        begin, stored == nullptr ? backend::View{} : backend::host_view(std::span(stored, 1)));
    return dlogits;
  };
  double stored = 0.25;
  CHECK(run(7.0, &stored) == run(0.25, nullptr));
  CHECK(run(7.0, &stored) != run(7.0, nullptr));
  float single = 0.25f;
  std::vector<float> dlogits(static_cast<size_t>(rows * width));
  auto in = logits;
  auto ids = labels;
  CHECK_THROWS_WITH_AS(
      backend::ops::cross_entropy_backward(
          device, backend::host_view(std::span(dlogits)), backend::host_view(std::span(in)),
          backend::host_view(std::span(logsumexp)), backend::host_view(std::span(ids)), 1.0, rows,
          width, begin, backend::host_view(std::span(&single, 1))),
      doctest::Contains("cross_entropy_backward: the stored scale must be 1 f64"), common::Error);
}

TEST_CASE("the fused classifier reads a stored scale when it runs, not when it is queued") {
  // A captured step's micro batches each stage their scale at one address (the model's
  // classifier_gradient_scale, in the logits' type); the op reads it then.
  backend::CpuDevice device;
  const int64_t rows = 3;
  const auto logits = convert<float>(random_values(rows * kLossVocab, 55, 2.0));
  const auto labels = random_ids(rows, static_cast<int32_t>(kLossVocab), 56);
  auto run = [&](double scale, double* stored) {
    std::vector<float> losses(rows), logsumexp(rows);
    auto in_place = logits;
    auto ids = labels;
    backend::ops::cross_entropy_forward_backward(
        device, backend::host_view(std::span(losses)), backend::host_view(std::span(logsumexp)),
        backend::host_view(std::span(in_place)), backend::host_view(std::span(ids)), scale, rows,
        kLossVocab, stored == nullptr ? backend::View{} : backend::host_view(std::span(stored, 1)));
    return in_place;
  };
  double stored = static_cast<float>(1.0 / 3.0);
  CHECK(run(7.0, &stored) == run(static_cast<float>(1.0 / 3.0), nullptr));
  stored = 0.25;
  CHECK(run(7.0, &stored) == run(0.25, nullptr));
  CHECK(run(7.0, &stored) != run(7.0, nullptr));
  float single = 0.25f;
  auto ids = labels;
  std::vector<float> losses(rows), logsumexp(rows);
  auto in_place = logits;
  CHECK_THROWS_WITH_AS(
      backend::ops::cross_entropy_forward_backward(
          device, backend::host_view(std::span(losses)), backend::host_view(std::span(logsumexp)),
          backend::host_view(std::span(in_place)), backend::host_view(std::span(ids)), 1.0, rows,
          kLossVocab, backend::host_view(std::span(&single, 1))),
      doctest::Contains("cross_entropy_forward_backward: the stored scale must "
                        "be 1 f64"),
      common::Error);
}
