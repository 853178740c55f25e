// --grad-reduce-in-bf16's communicator (backend/model/bf16_gradient_reduction.hpp) over Open
// MPI ranks (mpirun -np 3) on the CPU device: fp32 sums are each rank's values rounded to bf16,
// summed (in fp32, rounded once: Open MPI's 16-bit sums) and widened back, in all_reduce,
// reduce_scatter and started all-reduces (several in flight at once); other types and calls
// pass through untouched.
#include "backend/model/bf16_gradient_reduction.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::ReduceOperation;
using backend::View;

// Named: the MPI tests build as one unity file.
namespace bf16_reduction_test {

template <typename T>
View host_values(std::vector<T>& values) {
  return backend::host_view(std::span(values));
}

float bf16_rounded(float value) {
  return backend::to_float(backend::to_bfloat16(value));
}

// Rank r's value at i: not representable in bf16, so the rounding before the sum shows.
float value_at(int64_t rank, int64_t i) {
  return 1.0f + static_cast<float>(rank) * 0x1p-7f + static_cast<float>(i % 5) * 0x1p-10f;
}

// The sum --grad-reduce-in-bf16 gives: each rank's value rounded, the fp32 sum rounded.
float expected_sum(int64_t size, int64_t i) {
  float sum = 0;
  for (int64_t r = 0; r < size; ++r) sum += bf16_rounded(value_at(r, i));
  return bf16_rounded(sum);
}

}  // namespace bf16_reduction_test

using bf16_reduction_test::expected_sum;
using bf16_reduction_test::value_at;

TEST_CASE("--grad-reduce-in-bf16 sums fp32 gradients through bf16 and passes the rest through") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  backend::CpuDevice device;
  const auto reduction = backend::make_bf16_gradient_reduction(world, device);
  CHECK(reduction->rank() == rank);
  CHECK(reduction->size() == size);
  CHECK(reduction->name() == world.name());

  std::vector<float> gradients(37);
  for (int64_t i = 0; i < 37; ++i) gradients[static_cast<size_t>(i)] = value_at(rank, i);
  std::vector<float> expected(37);
  for (int64_t i = 0; i < 37; ++i) expected[static_cast<size_t>(i)] = expected_sum(size, i);
  auto summed = gradients;
  reduction->all_reduce(bf16_reduction_test::host_values(summed), ReduceOperation::sum);
  CHECK(summed == expected);
  // Not the fp32 sum: the rounding is real.
  float fp32_sum = 0;
  for (int64_t r = 0; r < size; ++r) fp32_sum += value_at(r, 1);
  CHECK(summed[1] != fp32_sum);

  // Three started at once, finished in another order; one never waited for.
  std::vector<std::vector<float>> buckets(3, gradients);
  std::vector<std::unique_ptr<backend::Communicator::PendingCollective>> pending;
  for (auto& bucket : buckets) {
    pending.push_back(reduction->start_all_reduce(bf16_reduction_test::host_values(bucket),
                                                  ReduceOperation::sum));
  }
  pending[2]->wait();
  pending[0]->wait();
  pending[1]->wait();
  for (const auto& bucket : buckets) CHECK(bucket == expected);
  auto dropped = gradients;
  reduction->start_all_reduce(bf16_reduction_test::host_values(dropped), ReduceOperation::sum)
      .reset();

  const backend::ShardRange own = backend::shard_range(37, size, rank);
  std::vector<float> shard(static_cast<size_t>(own.numel));
  reduction->reduce_scatter(bf16_reduction_test::host_values(shard),
                            bf16_reduction_test::host_values(gradients));
  CHECK(shard == std::vector<float>(expected.begin() + own.offset,
                                    expected.begin() + own.offset + own.numel));

  // fp64 host scalars (losses, norms) and gathers are the group's own.
  std::vector<double> loss = {0.1 * static_cast<double>(rank + 1)};
  reduction->all_reduce(bf16_reduction_test::host_values(loss), ReduceOperation::sum);
  double exact = 0;
  for (int64_t r = 0; r < size; ++r) exact += 0.1 * static_cast<double>(r + 1);
  CHECK(loss[0] == doctest::Approx(exact).epsilon(1e-15));
  std::vector<float> gathered(static_cast<size_t>(size));
  std::vector<float> mine = {value_at(rank, 0)};
  reduction->all_gather(bf16_reduction_test::host_values(gathered),
                        bf16_reduction_test::host_values(mine));
  for (int64_t r = 0; r < size; ++r) CHECK(gathered[static_cast<size_t>(r)] == value_at(r, 0));

  CHECK_THROWS_WITH_AS(reduction->split(0, rank, "part"),
                       doctest::Contains("--grad-reduce-in-bf16 reduction is not split"),
                       common::Error);
}
