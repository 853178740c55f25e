// world = tp × pp × dp, with the refusals naming the flags.
#include <doctest/doctest.h>

#include "backend/common/error.hpp"
#include "backend/dist/parallel_layout.hpp"

using backend::make_parallel_layout;

TEST_CASE("data-parallel size is what tp × pp leave of the world") {
  const auto layout = make_parallel_layout(64, 2, 4);
  CHECK(layout.data_parallel == 8);
  CHECK(make_parallel_layout(1, 1, 1).data_parallel == 1);
}

TEST_CASE("layouts that do not tile the world are refused naming the flags") {
  CHECK_THROWS_WITH_AS(make_parallel_layout(6, 4, 1),
                       doctest::Contains("world size 6 is not divisible by "
                                         "--tensor-model-parallel-size 4"),
                       common::Error);
  CHECK_THROWS_WITH_AS(make_parallel_layout(8, 0, 1),
                       doctest::Contains("--tensor-model-parallel-size must be ≥ 1"), common::Error);
  CHECK_THROWS_AS(make_parallel_layout(0, 1, 1), common::Error);
}
