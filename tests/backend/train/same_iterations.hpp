// Two training runs' logged iterations compared bit for bit: what a run that must equal another
// (replayed from graphs, resumed) is checked with. A skipped overflow's gradient norm is a NaN,
// compared by its bits.
#pragma once

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>

#include "backend/train/trainer.hpp"

namespace test_support {

inline uint64_t double_bits(double value) {
  return std::bit_cast<uint64_t>(value);
}

inline void check_same_iterations(const backend::TrainingResult& actual,
                                  const backend::TrainingResult& expected) {
  REQUIRE(actual.iterations.size() == expected.iterations.size());
  REQUIRE(!expected.iterations.empty());
  for (size_t i = 0; i < expected.iterations.size(); ++i) {
    CAPTURE(i);
    CHECK(actual.iterations[i].lm_loss == expected.iterations[i].lm_loss);
    CHECK(double_bits(actual.iterations[i].grad_norm) ==
          double_bits(expected.iterations[i].grad_norm));
    CHECK(actual.iterations[i].learning_rate == expected.iterations[i].learning_rate);
    CHECK(actual.iterations[i].params_norm == expected.iterations[i].params_norm);
    CHECK(actual.iterations[i].skipped == expected.iterations[i].skipped);
    CHECK(actual.iterations[i].loss_scale == expected.iterations[i].loss_scale);
  }
}

}  // namespace test_support
