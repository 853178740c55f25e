// The Open MPI communicator on real ranks (mpirun -np 3): every collective of
// backend/dist/communicator.hpp against values each rank can compute for itself, the batches of
// point-to-point transfers pipeline parallelism exchanges, splits into groups as Megatron's
// layout makes them, and the errors a wrong call gets.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/process_groups.hpp"
#include "mpi/mpi_test_world.hpp"

using backend::ElementType;
using backend::MemoryKind;
using backend::PointToPoint;
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

TEST_CASE("started all-reduces finish in wait(), several at once, and the default runs at once") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  std::vector<std::vector<float>> buckets;
  for (int b = 0; b < 4; ++b) buckets.push_back(std::vector<float>(1000 + 37 * b, static_cast<float>(rank + b)));
  std::vector<std::unique_ptr<backend::Communicator::PendingCollective>> pending;
  for (auto& bucket : buckets) pending.push_back(world.start_all_reduce(view_of(bucket), ReduceOperation::sum));
  for (const auto& reduction : pending) reduction->wait();
  const float rank_sum = static_cast<float>(size * (size - 1) / 2);
  for (int b = 0; b < 4; ++b) {
    CAPTURE(b);
    CHECK(buckets[static_cast<size_t>(b)] ==
          std::vector<float>(1000 + 37 * b, rank_sum + static_cast<float>(size * b)));
  }
  // One never waited for is finished by its destructor.
  std::vector<double> dropped(8, 1.0);
  world.start_all_reduce(view_of(dropped), ReduceOperation::sum).reset();
  CHECK(dropped == std::vector<double>(8, static_cast<double>(size)));
  // The one-process communicator's (the interface's default): done when it returns.
  const auto one = backend::make_single_process_communicator("data parallel");
  std::vector<float> alone = {2.0f};
  const auto finished = one->start_all_reduce(view_of(alone), ReduceOperation::sum);
  CHECK(alone == std::vector<float>{2.0f});
  finished->wait();
}

TEST_CASE("reduce-scatter gives each rank its shard of the sum — all-gather puts shards in order") {
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

TEST_CASE("a started reduce-scatter of uneven counts gives each rank the sums of its part") {
  // A bucket of 11 elements cut as the distributed optimizer's shards cut it: rank 0 none of it,
  // the others the rest (the last rank the remainder), waited after a second one started.
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  std::vector<int64_t> counts(static_cast<size_t>(size), 0);
  for (int64_t r = 1; r < size; ++r) counts[static_cast<size_t>(r)] = 11 / (size - 1);
  counts.back() += 11 - (size - 1) * (11 / (size - 1));
  int64_t first = 0;
  for (int64_t r = 0; r < rank; ++r) first += counts[static_cast<size_t>(r)];
  std::vector<float> input(11), output(static_cast<size_t>(counts[static_cast<size_t>(rank)]));
  for (int64_t i = 0; i < 11; ++i)
    input[static_cast<size_t>(i)] = static_cast<float>(rank * 100 + i);
  std::vector<double> second_input(static_cast<size_t>(size), 1.0), second_output(1);
  const std::vector<int64_t> ones(static_cast<size_t>(size), 1);
  auto pending = world.start_reduce_scatter(view_of(output), view_of(input), counts);
  auto second = world.start_reduce_scatter(view_of(second_output), view_of(second_input), ones);
  second->wait();
  pending->wait();
  for (size_t j = 0; j < output.size(); ++j) {
    const auto i = static_cast<float>(first) + static_cast<float>(j);
    CHECK(output[j] ==
          static_cast<float>(100 * size * (size - 1) / 2) + static_cast<float>(size) * i);
  }
  CHECK(second_output[0] == static_cast<double>(size));

  // bf16: summed in fp32 and rounded once, as the other sums.
  std::vector<uint16_t> narrow_input(
      11, backend::to_bfloat16(1.0f + static_cast<float>(rank) * 0x1p-7f).bits);
  std::vector<uint16_t> narrow_output(output.size());
  const View narrow_in{narrow_input.data(), 11, ElementType::bf16, MemoryKind::host};
  const View narrow_out{narrow_output.data(), static_cast<int64_t>(narrow_output.size()),
                        ElementType::bf16, MemoryKind::host};
  world.start_reduce_scatter(narrow_out, narrow_in, counts)->wait();
  float exact = 0;
  for (int64_t r = 0; r < size; ++r) exact += 1.0f + static_cast<float>(r) * 0x1p-7f;
  CHECK(narrow_output ==
        std::vector<uint16_t>(narrow_output.size(), backend::to_bfloat16(exact).bits));

  // Counts that do not add up, or that disagree with the output, are refused before any call.
  std::vector<int64_t> wrong = counts;
  wrong[0] += 1;
  CHECK_THROWS_WITH_AS(world.start_reduce_scatter(view_of(output), view_of(input), wrong),
                       doctest::Contains("MPI_Ireduce_scatter in the world group: counts summing "
                                         "to 12 for a whole of 11 elements"),
                       common::Error);
}

TEST_CASE("a started all-gather of uneven parts gives every rank every part, in place or not") {
  // --overlap-param-gather's bucket: rank 0 holds none of it, the others the rest; the first
  // in place (each rank's part inside the output), the second from a separate input, both in
  // flight at once and waited in reverse order.
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  std::vector<int64_t> counts(static_cast<size_t>(size), 0);
  for (int64_t r = 1; r < size; ++r) counts[static_cast<size_t>(r)] = 13 / (size - 1);
  counts.back() += 13 - (size - 1) * (13 / (size - 1));
  std::vector<int64_t> firsts(static_cast<size_t>(size), 0);
  for (int64_t r = 1; r < size; ++r) {
    firsts[static_cast<size_t>(r)] =
        firsts[static_cast<size_t>(r - 1)] + counts[static_cast<size_t>(r - 1)];
  }
  const auto own = static_cast<size_t>(rank);
  const auto value = [](int64_t holder, int64_t i) {
    return static_cast<float>(holder * 1000 + i);
  };
  std::vector<float> in_place(13, -1.0f), gathered(13, -1.0f),
      input(static_cast<size_t>(counts[own]));
  for (int64_t j = 0; j < counts[own]; ++j) {
    in_place[static_cast<size_t>(firsts[own] + j)] = value(rank, firsts[own] + j);
    input[static_cast<size_t>(j)] = value(rank, firsts[own] + j);
  }
  const View whole = view_of(in_place);
  auto first = world.start_all_gather(whole, whole.slice(firsts[own], counts[own]), counts);
  auto second = world.start_all_gather(view_of(gathered), view_of(input), counts);
  second->wait();
  first->wait();
  first->wait();  // a second wait returns at once
  std::vector<float> expected(13);
  for (int64_t r = 0; r < size; ++r) {
    for (int64_t j = 0; j < counts[static_cast<size_t>(r)]; ++j) {
      const int64_t i = firsts[static_cast<size_t>(r)] + j;
      expected[static_cast<size_t>(i)] = value(r, i);
    }
  }
  CHECK(in_place == expected);
  CHECK(gathered == expected);

  // 16-bit values move as they are (nothing is summed).
  std::vector<uint16_t> words(13, 0);
  for (int64_t j = 0; j < counts[own]; ++j)
    words[static_cast<size_t>(firsts[own] + j)] = static_cast<uint16_t>(0x3f80 + rank);
  const View narrow{words.data(), 13, ElementType::bf16, MemoryKind::host};
  world.start_all_gather(narrow, narrow.slice(firsts[own], counts[own]), counts)->wait();
  for (int64_t r = 0; r < size; ++r) {
    for (int64_t j = 0; j < counts[static_cast<size_t>(r)]; ++j) {
      CHECK(words[static_cast<size_t>(firsts[static_cast<size_t>(r)] + j)] == 0x3f80 + r);
    }
  }

  // Counts that disagree with the input, or do not add up to the output, are refused first.
  std::vector<int64_t> wrong = counts;
  wrong[own] += 1;
  CHECK_THROWS_WITH_AS(world.start_all_gather(view_of(gathered), view_of(input), wrong),
                       doctest::Contains("MPI_Iallgatherv in the world group: counts summing to 14 "
                                         "for a whole of 13 elements"),
                       common::Error);
}

TEST_CASE("bf16 and fp16 are summed in fp32 and rounded once, in every summing collective") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  // Rank r holds 1 + r·2^-7 (exact in both types). Their fp32 sum rounded once is the expected
  // value; with 3 ranks it is 3.03125 in bf16, where rounding after each addition (1 + 1.0078125
  // ties to 2) would give 3.015625.
  const float mine = 1.0f + static_cast<float>(rank) * 0x1p-7f;
  float exact = 0;
  for (int64_t r = 0; r < size; ++r) exact += 1.0f + static_cast<float>(r) * 0x1p-7f;
  const auto bf16_of = [](float value) { return backend::to_bfloat16(value).bits; };
  const auto fp16_of = [](float value) { return backend::to_float16(value).bits; };
  for (const ElementType type : {ElementType::bf16, ElementType::f16}) {
    CAPTURE(backend::element_name(type));
    const auto narrow = type == ElementType::bf16 ? +bf16_of : +fp16_of;
    const auto typed = [&](std::vector<uint16_t>& words) {
      return View{words.data(), static_cast<int64_t>(words.size()), type, MemoryKind::host};
    };
    std::vector<uint16_t> sums(5, narrow(mine));
    world.all_reduce(typed(sums), ReduceOperation::sum);
    CHECK(sums == std::vector<uint16_t>(5, narrow(exact)));
    if (type == ElementType::bf16 && size == 3)
      CHECK(backend::to_float(backend::bfloat16{sums[0]}) == 3.03125f);

    std::vector<uint16_t> maximum = {narrow(-static_cast<float>(rank))};
    world.all_reduce(typed(maximum), ReduceOperation::max);
    CHECK(maximum[0] == narrow(-0.0f));

    std::vector<uint16_t> started(7, narrow(mine));
    auto pending = world.start_all_reduce(typed(started), ReduceOperation::sum);
    pending->wait();
    CHECK(started == std::vector<uint16_t>(7, narrow(exact)));

    std::vector<uint16_t> whole(static_cast<size_t>(2 * size + 1), narrow(mine));
    const backend::ShardRange own = backend::shard_range(2 * size + 1, size, rank);
    std::vector<uint16_t> shard(static_cast<size_t>(own.numel));
    world.reduce_scatter(typed(shard), typed(whole));
    CHECK(shard == std::vector<uint16_t>(static_cast<size_t>(own.numel), narrow(exact)));
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

namespace {

PointToPoint send_to(int64_t peer, View values, int64_t tag = 0) {
  return {.direction = PointToPoint::Direction::send, .values = values, .peer = peer, .tag = tag};
}
PointToPoint receive_from(int64_t peer, View values, int64_t tag = 0) {
  return {.direction = PointToPoint::Direction::receive, .values = values, .peer = peer,
          .tag = tag};
}

// Element i of what `rank` sends with `tag`: distinct per sender, tag and element.
float sent_value(int64_t rank, int64_t tag, size_t i) {
  return static_cast<float>(rank * 1000 + tag * 100) + static_cast<float>(i % 97);
}
std::vector<float> sent_values(int64_t rank, int64_t tag, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = sent_value(rank, tag, i);
  return values;
}

}  // namespace

TEST_CASE("an exchange sends round a ring that blocking sends would deadlock") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  // 4 MiB: far above Open MPI's eager limit, so every rank's MPI_Send would wait for a receive
  // that its neighbour, itself sending, never posts. Each rank lists its send first.
  const size_t count = size_t{1} << 20;
  std::vector<float> outgoing = sent_values(rank, 0, count), incoming(count, -1.0f);
  const std::vector<PointToPoint> batch = {send_to(next, view_of(outgoing)),
                                           receive_from(previous, view_of(incoming))};
  world.exchange(batch);
  CHECK(incoming == sent_values(previous, 0, count));
  CHECK(outgoing == sent_values(rank, 0, count));  // a send leaves its values as they were
  world.exchange({});                              // an empty batch returns at once
}

TEST_CASE("an exchange's transfers to one peer match by tag, then in posting order") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  const size_t count = size_t{1} << 18;
  // Sends with tags 0, 1, 2, 2 in that order; receives listed 1, 0, then the two of tag 2.
  std::vector<float> tag0 = sent_values(rank, 0, count), tag1 = sent_values(rank, 1, count);
  std::vector<float> first2 = sent_values(rank, 2, count), second2 = sent_values(rank, 3, count);
  std::vector<float> got0(count), got1(count), got_first2(count), got_second2(count);
  const std::vector<PointToPoint> batch = {
      receive_from(previous, view_of(got1), 1),   send_to(next, view_of(tag0), 0),
      receive_from(previous, view_of(got0), 0),   send_to(next, view_of(tag1), 1),
      send_to(next, view_of(first2), 2),          send_to(next, view_of(second2), 2),
      receive_from(previous, view_of(got_first2), 2),
      receive_from(previous, view_of(got_second2), 2)};
  world.exchange(batch);
  CHECK(got0 == sent_values(previous, 0, count));
  CHECK(got1 == sent_values(previous, 1, count));
  CHECK(got_first2 == sent_values(previous, 2, count));
  CHECK(got_second2 == sent_values(previous, 3, count));
}

TEST_CASE("an exchange moves fp64 values, to the next rank and to itself") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  // Values fp32 cannot hold: the bits move, not a rounded copy.
  std::vector<double> outgoing = {1.0 + 1e-12 * static_cast<double>(rank), -0.1, 1e300};
  std::vector<double> from_previous(3), from_self(3);
  const std::vector<PointToPoint> batch = {receive_from(previous, view_of(from_previous), 5),
                                           receive_from(rank, view_of(from_self), 5),
                                           send_to(rank, view_of(outgoing), 5),
                                           send_to(next, view_of(outgoing), 5)};
  world.exchange(batch);
  CHECK(from_previous == std::vector<double>{1.0 + 1e-12 * static_cast<double>(previous), -0.1,
                                             1e300});
  CHECK(from_self == outgoing);
}

TEST_CASE("a wrong exchange is an error naming the group: a peer outside it, a tag, a type") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  std::vector<float> values(4, 1.0f);
  // Refused on every rank before anything is posted.
  const std::vector<PointToPoint> outside = {receive_from(0, view_of(values)),
                                             send_to(size, view_of(values))};
  const std::string not_member = "MPI_Isend in the world group: rank " + std::to_string(size) +
                                 " is not one of its " + std::to_string(size) + " members";
  CHECK_THROWS_WITH_AS(world.exchange(outside), doctest::Contains(not_member.c_str()),
                       common::Error);
  const std::vector<PointToPoint> negative = {receive_from(-1, view_of(values))};
  CHECK_THROWS_WITH_AS(world.exchange(negative),
                       doctest::Contains("MPI_Irecv in the world group: rank -1"), common::Error);
  const std::vector<PointToPoint> bad_tag = {send_to(0, view_of(values), -1)};
  CHECK_THROWS_WITH_AS(world.exchange(bad_tag),
                       doctest::Contains("MPI_Isend in the world group: tag -1 is not one of 0 "
                                         "to"),
                       common::Error);
  const std::vector<PointToPoint> huge_tag = {send_to(0, view_of(values), int64_t{1} << 40)};
  CHECK_THROWS_WITH_AS(world.exchange(huge_tag), doctest::Contains("(MPI_TAG_UB)"),
                       common::Error);
  const View gpu{values.data(), 4, ElementType::f32, MemoryKind::cuda};
  CHECK_THROWS_WITH_AS(world.exchange(std::vector<PointToPoint>{send_to(0, gpu)}),
                       doctest::Contains("MPI_Isend in the world group was given GPU memory"),
                       common::Error);

  // Rank 1 sends 4 fp32 (16 bytes, eager: its sends complete alone); rank 0 receives them as 4
  // fp64 (a shorter message, which MPI accepts) and then as 4 bf16 (a longer one: truncated).
  std::vector<double> wide(4);
  std::vector<uint16_t> narrow(4);
  const View narrow_view{narrow.data(), 4, ElementType::bf16, MemoryKind::host};
  if (rank == 1) {
    world.exchange(std::vector<PointToPoint>{send_to(0, view_of(values), 7),
                                             send_to(0, view_of(values), 8)});
  } else if (rank == 0) {
    const std::vector<PointToPoint> into_wide = {receive_from(1, view_of(wide), 7)};
    CHECK_THROWS_WITH_AS(world.exchange(into_wide),
                         "MPI_Irecv in the world group: rank 1 sent 2 elements' worth of fp64 "
                         "with tag 7 where 4 elements of fp64 were expected: the two sides' "
                         "sizes or element types differ",
                         common::Error);
    const std::vector<PointToPoint> into_narrow = {receive_from(1, narrow_view, 8)};
    CHECK_THROWS_WITH_AS(world.exchange(into_narrow),
                         "MPI_Irecv in the world group: rank 1 sent more than the 4 elements of "
                         "bf16 expected with tag 8: the two sides' sizes or element types differ",
                         common::Error);
  }
  world.barrier();
  // The group still exchanges afterwards.
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  std::vector<int32_t> outgoing = {static_cast<int32_t>(rank)}, incoming = {-1};
  world.exchange(std::vector<PointToPoint>{send_to(next, view_of(outgoing)),
                                           receive_from(previous, view_of(incoming))});
  CHECK(incoming[0] == previous);
}

TEST_CASE("started exchanges pair across batches in posting order, whichever is waited first") {
  auto& world = mpi_test::world();
  const int64_t rank = world.rank(), size = world.size();
  const int64_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
  // Above Open MPI's eager limit: a send completes only once its receive is posted.
  const size_t count = size_t{1} << 18;
  std::vector<float> first = sent_values(rank, 0, count), second = sent_values(rank, 1, count);
  std::vector<float> got_first(count, -1.0f), got_second(count, -1.0f);
  auto a = world.start_exchange(std::vector<PointToPoint>{
      send_to(next, view_of(first)), receive_from(previous, view_of(got_first))});
  auto b = world.start_exchange(std::vector<PointToPoint>{
      send_to(next, view_of(second)), receive_from(previous, view_of(got_second))});
  b->wait();  // the later batch first: both are posted, so neither holds up the other
  a->wait();
  a->wait();  // a second wait returns at once
  CHECK(got_first == sent_values(previous, 0, count));
  CHECK(got_second == sent_values(previous, 1, count));
  CHECK(world.start_exchange({}) != nullptr);  // an empty batch: finished at once

  // start_exchange returns before its batch completes: rank 0's receive waits for a send rank 1
  // makes only after rank 0 has told it, after start_exchange returned (a blocking start would
  // never return).
  std::vector<int32_t> signal = {1}, answer = {-1};
  if (rank == 0) {
    auto receiving =
        world.start_exchange(std::vector<PointToPoint>{receive_from(1, view_of(answer), 3)});
    world.exchange(std::vector<PointToPoint>{send_to(1, view_of(signal), 4)});
    receiving->wait();
    CHECK(answer[0] == 42);
  } else if (rank == 1) {
    world.exchange(std::vector<PointToPoint>{receive_from(0, view_of(signal), 4)});
    answer[0] = 42;
    world.exchange(std::vector<PointToPoint>{send_to(0, view_of(answer), 3)});
  }

  // One dropped unwaited is finished by its destructor: its values are there after.
  std::vector<int32_t> outgoing = {static_cast<int32_t>(rank)}, incoming = {-1};
  world.start_exchange(std::vector<PointToPoint>{send_to(next, view_of(outgoing)),
                                                 receive_from(previous, view_of(incoming))});
  CHECK(incoming[0] == previous);

  // A size mismatch shows at wait(), in exchange()'s words.
  std::vector<double> wide(4);
  std::vector<float> four(4, 1.0f);
  if (rank == 1) {
    world.exchange(std::vector<PointToPoint>{send_to(0, view_of(four), 7)});
  } else if (rank == 0) {
    auto started =
        world.start_exchange(std::vector<PointToPoint>{receive_from(1, view_of(wide), 7)});
    CHECK_THROWS_WITH_AS(started->wait(),
                         "MPI_Irecv in the world group: rank 1 sent 2 elements' worth of fp64 "
                         "with tag 7 where 4 elements of fp64 were expected: the two sides' "
                         "sizes or element types differ",
                         common::Error);
  }
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
  const View gpu{values.data(), 4, ElementType::f32, MemoryKind::cuda};
  CHECK_THROWS_WITH_AS(world.all_reduce(gpu, ReduceOperation::sum),
                       doctest::Contains("was given GPU memory"), common::Error);
}
