// The Open MPI communicator on real ranks (mpirun -np 3): every collective of
// backend/dist/communicator.hpp against values each rank can compute for itself, splits into
// groups as Megatron's layout makes them, and the errors a wrong call gets.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/process_groups.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::ElementType;
using backend::MemoryKind;
using backend::ReduceOperation;
using backend::View;

namespace {

template <typename T>
View view_of(std::vector<T>& values) {
  return backend::host_view(std::span(values));
}

}  // namespace

TEST_CASE("all-reduce sums and takes the maximum over every rank") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  REQUIRE(size >= 2);
  std::vector<float> values = {static_cast<float>(rank), 1.0f, -0.5f * static_cast<float>(rank)};
  world.all_reduce(view_of(values), ReduceOperation::sum);
  const float rank_sum = static_cast<float>(size * (size - 1) / 2);
  CHECK(values == std::vector<float>{rank_sum, static_cast<float>(size), -0.5f * rank_sum});
  std::vector<double> maximum = {static_cast<double>(rank)};
  world.all_reduce(view_of(maximum), ReduceOperation::max);
  CHECK(maximum[0] == static_cast<double>(size - 1));
}

TEST_CASE("reduce-scatter gives each rank its shard of the sum; all-gather puts shards in order") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  for (const int64_t numel : {int64_t{5} * size, int64_t{5} * size + 2, int64_t{1}}) {
    CAPTURE(numel);
    std::vector<float> input(static_cast<size_t>(numel));
    for (size_t i = 0; i < input.size(); ++i) {
      input[i] = static_cast<float>(i) + static_cast<float>(rank);
    }
    const backend::ShardRange shard = backend::shard_range(numel, size, rank);
    std::vector<float> mine(static_cast<size_t>(shard.numel));
    world.reduce_scatter(view_of(mine), view_of(input));
    for (int64_t i = 0; i < shard.numel; ++i) {
      const int64_t element = shard.offset + i;
      CHECK(mine[i] == static_cast<float>(element * size + size * (size - 1) / 2));
    }
    // All-gather in place: each rank's shard of the output is its input.
    std::vector<float> gathered(static_cast<size_t>(numel), -1.0f);
    for (int64_t i = 0; i < shard.numel; ++i) gathered[shard.offset + i] = mine[i];
    View own{gathered.data() + shard.offset, shard.numel, ElementType::f32, MemoryKind::host};
    world.all_gather(view_of(gathered), own);
    for (int64_t element = 0; element < numel; ++element) {
      CHECK(gathered[element] == static_cast<float>(element * size + size * (size - 1) / 2));
    }
  }
  std::vector<int32_t> own = {static_cast<int32_t>(rank), static_cast<int32_t>(10 * rank)};
  std::vector<int32_t> gathered(static_cast<size_t>(2 * size));
  world.all_gather(view_of(gathered), view_of(own));
  for (int64_t r = 0; r < size; ++r) {
    CHECK(gathered[2 * r] == r);
    CHECK(gathered[2 * r + 1] == 10 * r);
  }
}

TEST_CASE("broadcast, send and receive move bytes between named ranks") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  std::vector<double> from_last = {rank == size - 1 ? 2.5 : 0.0, rank == size - 1 ? -1.0 : 0.0};
  world.broadcast(view_of(from_last), size - 1);
  CHECK(from_last == std::vector<double>{2.5, -1.0});
  // A ring: each rank sends its rank to the next; even ranks send first, so nothing waits on
  // itself (blocking MPI_Send of a small message would not anyway).
  std::vector<int32_t> outgoing = {static_cast<int32_t>(rank)}, incoming = {-1};
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  if (rank % 2 == 0) {
    world.send(view_of(outgoing), next);
    world.receive(view_of(incoming), previous);
  } else {
    world.receive(view_of(incoming), previous);
    world.send(view_of(outgoing), next);
  }
  CHECK(incoming[0] == previous);
  world.barrier();
}

TEST_CASE("split makes Megatron's groups: a sum over the data-parallel group only") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank();
  // Each rank its own tensor-parallel group of one, all of them one data-parallel group.
  const auto layout = backend::make_parallel_layout(world.size(), 1, 1);
  const auto ranks = backend::group_ranks(layout, rank, backend::GroupKind::data_parallel);
  auto data_parallel = world.split(ranks.front(), rank, "data parallel");
  CHECK(data_parallel->size() == world.size());
  CHECK(data_parallel->rank() == rank);
  // Two groups by parity: each sums its own members' ranks.
  auto parity = world.split(rank % 2, rank, "parity");
  std::vector<int32_t> value = {static_cast<int32_t>(rank)};
  parity->all_reduce(view_of(value), ReduceOperation::sum);
  int32_t expected = 0;
  for (int64_t r = rank % 2; r < world.size(); r += 2) expected += static_cast<int32_t>(r);
  CHECK(value[0] == expected);
  CHECK(parity->name() == "parity");
}

TEST_CASE("wrong calls are errors that name the call, the group and the sizes") {
  auto& world = mpi_test::world();
  std::vector<float> values(4), short_output(1);
  CHECK_THROWS_WITH_AS(world.all_gather(view_of(short_output), view_of(values)),
                       doctest::Contains("MPI_Allgatherv in the world group: 1 elements out, so "
                                         "rank"),
                       common::Error);
  CHECK_THROWS_WITH_AS(world.send(view_of(values), world.size()),
                       doctest::Contains("MPI_Send in the world group: rank"), common::Error);
  std::vector<uint16_t> bf16(4);
  const View bf16_view{bf16.data(), 4, ElementType::bf16, MemoryKind::host};
  CHECK_THROWS_WITH_AS(world.all_reduce(bf16_view, ReduceOperation::sum),
                       "MPI_Allreduce in the world group: bf16 is not summed on CPU ranks",
                       common::Error);
  const View gpu{values.data(), 4, ElementType::f32, MemoryKind::cuda};
  CHECK_THROWS_WITH_AS(world.all_reduce(gpu, ReduceOperation::sum),
                       doctest::Contains("was given GPU memory"), common::Error);
}
