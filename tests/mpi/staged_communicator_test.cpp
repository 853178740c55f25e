// The staged and routed communicators (backend/dist/staged_communicator.hpp) on real Open MPI
// ranks (mpirun -np 3), over the CPU device, whose staging is a copy: one script of every
// collective (sums and maxima, reduce-scatter, all-gather in place and not, broadcast, send and
// receive, a ring exchange with tags, a split) run through the plain Open MPI communicator and
// through each staging gives the same bytes, in sizes that make the staging grow and shrink back.
#include "backend/dist/staged_communicator.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::Communicator;
using backend::PointToPoint;
using backend::ReduceOperation;
using backend::StagingMemory;
using backend::View;

namespace {

template <typename T>
View staged_test_view(std::vector<T>& values) {
  return backend::host_view(std::span(values));
}

// Every output the script's calls leave, in order, as float vectors (doubles and ints converted:
// each value is small and exact).
using ScriptOutputs = std::vector<std::vector<double>>;

template <typename T>
void record(ScriptOutputs& outputs, const std::vector<T>& values) {
  outputs.emplace_back(values.begin(), values.end());
}

ScriptOutputs run_every_collective(Communicator& group) {
  const int64_t rank = group.rank(), size = group.size();
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  ScriptOutputs outputs;
  for (const int64_t numel : {int64_t{3}, int64_t{5} * size + 2, int64_t{70000}, int64_t{1}}) {
    std::vector<float> values(static_cast<size_t>(numel));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>(i % 13) * 0.25f + static_cast<float>(rank);
    }
    std::vector<float> summed = values;
    group.all_reduce(staged_test_view(summed), ReduceOperation::sum);
    record(outputs, summed);
    std::vector<double> maximum(values.begin(), values.end());
    group.all_reduce(staged_test_view(maximum), ReduceOperation::max);
    record(outputs, maximum);

    const backend::ShardRange shard = backend::shard_range(numel, size, rank);
    std::vector<float> own(static_cast<size_t>(shard.numel));
    group.reduce_scatter(staged_test_view(own), staged_test_view(values));
    record(outputs, own);
    std::vector<float> gathered(static_cast<size_t>(numel), -1.0f);
    group.all_gather(staged_test_view(gathered), staged_test_view(own));
    record(outputs, gathered);
    // In place: the member's shard already in the output.
    std::vector<float> in_place(static_cast<size_t>(numel), -2.0f);
    std::copy(own.begin(), own.end(), in_place.begin() + shard.offset);
    const View whole = staged_test_view(in_place);
    group.all_gather(whole, whole.slice(shard.offset, shard.numel));
    record(outputs, in_place);

    std::vector<int32_t> from_last(static_cast<size_t>(numel), static_cast<int32_t>(rank));
    group.broadcast(staged_test_view(from_last), size - 1);
    record(outputs, from_last);

    std::vector<float> incoming(values.size(), -3.0f);
    if (rank % 2 == 0) {
      group.send(staged_test_view(values), next);
      group.receive(staged_test_view(incoming), previous);
    } else {
      group.receive(staged_test_view(incoming), previous);
      group.send(staged_test_view(values), next);
    }
    record(outputs, incoming);

    // A ring both ways, two tags to one peer listed out of order.
    std::vector<float> tagged(values.size()), other(values.size()), back(values.size());
    std::vector<double> doubled(values.begin(), values.end());
    for (double& value : doubled) value *= 2;
    std::vector<double> doubled_in(values.size());
    const std::vector<PointToPoint> batch = {{.direction = PointToPoint::Direction::receive,
                                              .values = staged_test_view(other),
                                              .peer = previous,
                                              .tag = 2},
                                             {.direction = PointToPoint::Direction::send,
                                              .values = staged_test_view(values),
                                              .peer = next,
                                              .tag = 1},
                                             {.direction = PointToPoint::Direction::receive,
                                              .values = staged_test_view(tagged),
                                              .peer = previous,
                                              .tag = 1},
                                             {.direction = PointToPoint::Direction::send,
                                              .values = staged_test_view(summed),
                                              .peer = next,
                                              .tag = 2},
                                             {.direction = PointToPoint::Direction::send,
                                              .values = staged_test_view(doubled),
                                              .peer = previous,
                                              .tag = 0},
                                             {.direction = PointToPoint::Direction::receive,
                                              .values = staged_test_view(doubled_in),
                                              .peer = next,
                                              .tag = 0},
                                             {.direction = PointToPoint::Direction::send,
                                              .values = staged_test_view(values),
                                              .peer = rank,
                                              .tag = 3},
                                             {.direction = PointToPoint::Direction::receive,
                                              .values = staged_test_view(back),
                                              .peer = rank,
                                              .tag = 3}};
    group.exchange(batch);
    record(outputs, tagged);
    record(outputs, other);
    record(outputs, doubled_in);
    record(outputs, back);
    record(outputs, values);  // sends leave their values as they were
  }
  // A split stages its groups alike: a sum over each parity's members.
  const std::unique_ptr<Communicator> parity = group.split(rank % 2, rank, "parity");
  std::vector<int32_t> value = {static_cast<int32_t>(rank) + 1};
  parity->all_reduce(staged_test_view(value), ReduceOperation::sum);
  record(outputs, value);
  outputs.push_back({static_cast<double>(parity->rank()), static_cast<double>(parity->size())});
  parity->barrier();
  group.barrier();
  return outputs;
}

// A communicator of the world's members of its own (the script's traffic apart from the
// world's).
std::unique_ptr<Communicator> duplicate_of_world() {
  Communicator& world = mpi_test::world();
  return world.split(0, world.rank(), "staged world");
}

}  // namespace

TEST_CASE("every collective staged through host memory gives the Open MPI communicator's bytes") {
  const ScriptOutputs plain = run_every_collective(mpi_test::world());
  backend::CpuDevice device;
  const auto staged =
      backend::make_staged_communicator(duplicate_of_world(), device, StagingMemory::host);
  CHECK(staged->rank() == mpi_test::world().rank());
  CHECK(staged->size() == mpi_test::world().size());
  CHECK(staged->name() == "staged world");
  const ScriptOutputs through_staging = run_every_collective(*staged);
  REQUIRE(through_staging.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(through_staging[i] == plain[i]);
  }
  // The staging is the device's: a pinned host buffer not counted as the device's memory.
  CHECK(device.memory_usage().allocated_bytes == 0);
}

TEST_CASE("every collective staged through device memory gives the Open MPI communicator's bytes") {
  const ScriptOutputs plain = run_every_collective(mpi_test::world());
  backend::CpuDevice device;
  const auto staged =
      backend::make_staged_communicator(duplicate_of_world(), device, StagingMemory::device);
  const ScriptOutputs through_staging = run_every_collective(*staged);
  REQUIRE(through_staging.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(through_staging[i] == plain[i]);
  }
  // The staging lives in the device's memory, grown to the script's largest call.
  CHECK(device.memory_usage().allocated_bytes > 70000 * 4);
}

TEST_CASE("a routed communicator sends host memory the host way, and the staging stays unused") {
  backend::CpuDevice device;
  // Host values that took the device route would grow its staging in the device's memory.
  const auto routed = backend::make_routed_communicator(
      backend::make_staged_communicator(duplicate_of_world(), device, StagingMemory::device),
      duplicate_of_world());
  const ScriptOutputs plain = run_every_collective(mpi_test::world());
  const ScriptOutputs through_routes = run_every_collective(*routed);
  CHECK(through_routes == plain);
  CHECK(device.memory_usage().allocated_bytes == 0);
}
