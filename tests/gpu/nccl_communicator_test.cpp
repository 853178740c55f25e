// The NCCL communicator with one rank on one GPU (backend/dist/nccl_communicator.hpp), made as
// the world is (make_nccl_world: no MPI and one rank need no rendezvous): all_reduce (sum, max;
// fp32, bf16, fp64, int32), reduce_scatter and all_gather of a buffer of 7 elements (in place
// too), broadcast and barrier against the one-process communicator's results on the same values
// in host memory; an exchange with itself whose receives are listed in another tag order than
// its sends; split; and the refusals (host memory, a send to itself, a rank outside the group,
// a negative color); started all-reduces (--overlap-grad-reduce's) and a started exchange
// ordered with the compute stream; a chain of blocking all-reduces and compute ops, which the host
// does not wait between, kept in order. Skipped without a GPU (gpu_test_support.hpp) or without
// NCCL in the build. One rank's shards are the whole buffer, so the uneven-shard path (grouped
// ncclReduce and ncclBroadcast) needs two GPUs and does not run here.
#include "backend/dist/nccl_communicator.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/ops/reduction.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::Communicator;
using backend::ElementType;
using backend::PointToPoint;
using backend::ReduceOperation;
using backend::View;
using namespace gpu_test;

namespace {

// The NCCL world of this one rank on `gpu`, or nullptr after reporting the skip.
std::unique_ptr<Communicator> open_nccl_or_skip(Device& gpu) {
  try {
    return backend::make_nccl_world(gpu, backend::NcclBootstrap{});
  } catch (const common::Error& error) {
    if (std::string(error.what()).find("built without CUDA/NCCL") == std::string::npos) throw;
    MESSAGE("skipped: " << error.what());
    return nullptr;
  }
}

// What the one-process communicator makes of `values` (host memory), the reference.
std::vector<float> one_process(const std::vector<float>& values,
                               void (*call)(Communicator&, View, View)) {
  auto reference = backend::make_single_process_communicator("reference");
  std::vector<float> input = values, output(values.size(), -1.0f);
  call(*reference, backend::host_view(std::span(output)), backend::host_view(std::span(input)));
  return output;
}

}  // namespace

TEST_CASE("NCCL communicator, one rank: collectives against the one-process communicator") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  CHECK(world->rank() == 0);
  CHECK(world->size() == 1);
  CHECK(world->name() == "world");
  Tensors tensors(*gpu);
  const std::vector<float> values = representable(random_values(7, 21), ElementType::bf16);

  for (const ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f64}) {
    for (const ReduceOperation operation : {ReduceOperation::sum, ReduceOperation::max}) {
      View on_gpu = tensors.input(values, type);
      world->all_reduce(on_gpu, operation);
      std::vector<float> expected = values;
      backend::make_single_process_communicator("reference")
          ->all_reduce(backend::host_view(std::span(expected)), operation);
      expect_close(std::string("all_reduce ") + type_name(type), tensors.read(on_gpu), expected,
                   0.0);
    }
  }
  {
    std::vector<int32_t> ids = {3, -1, 7, 0, 42};
    View on_gpu = tensors.ids(ids);
    world->all_reduce(on_gpu, ReduceOperation::max);
    std::vector<int32_t> back(ids.size());
    gpu->copy_to_host(back.data(), on_gpu);
    CHECK(back == ids);
  }

  // reduce_scatter and all_gather of 7 elements, out of place and in place.
  {
    View input = tensors.input(values, ElementType::f32);
    View output = tensors.poisoned(7, ElementType::f32);
    world->reduce_scatter(output, input);
    expect_close(
        "reduce_scatter", tensors.read(output),
        one_process(values, [](Communicator& c, View o, View i) { c.reduce_scatter(o, i); }), 0.0);
    View gathered = tensors.poisoned(7, ElementType::f32);
    world->all_gather(gathered, output);
    expect_close("all_gather", tensors.read(gathered),
                 one_process(values, [](Communicator& c, View o, View i) { c.all_gather(o, i); }),
                 0.0);
    world->all_gather(gathered, gathered);  // the input is the output's own (whole) shard
    expect_close("all_gather in place", tensors.read(gathered), values, 0.0);
  }

  View broadcast = tensors.input(values, ElementType::bf16);
  world->broadcast(broadcast, 0);
  expect_close("broadcast", tensors.read(broadcast), values, 0.0);
  world->barrier();
  world->all_reduce(tensors.empty(ElementType::f32), ReduceOperation::sum);  // nothing to do
}

TEST_CASE("NCCL communicator, one rank: exchange with itself pairs equal tags, and split") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  Tensors tensors(*gpu);
  const std::vector<float> first = random_values(1000, 5), second = random_values(1000, 6);
  View send0 = tensors.input(first, ElementType::f32),
       send1 = tensors.input(second, ElementType::f32);
  View got0 = tensors.poisoned(1000, ElementType::f32),
       got1 = tensors.poisoned(1000, ElementType::f32);
  // The receives are listed tag 1 first: NCCL matches in posting order, the interface by tag.
  const std::vector<PointToPoint> batch = {
      {.direction = PointToPoint::Direction::receive, .values = got1, .peer = 0, .tag = 1},
      {.direction = PointToPoint::Direction::send, .values = send0, .peer = 0, .tag = 0},
      {.direction = PointToPoint::Direction::receive, .values = got0, .peer = 0, .tag = 0},
      {.direction = PointToPoint::Direction::send, .values = send1, .peer = 0, .tag = 1}};
  world->exchange(batch);
  expect_close("exchange tag 0", tensors.read(got0), first, 0.0);
  expect_close("exchange tag 1", tensors.read(got1), second, 0.0);
  world->exchange({});
  // The same batch started (the pipeline's overlapped transfers), waited for, then read.
  View later0 = tensors.poisoned(1000, ElementType::f32),
       later1 = tensors.poisoned(1000, ElementType::f32);
  std::vector<PointToPoint> started = batch;
  started[0].values = later1;
  started[2].values = later0;
  world->start_exchange(started)->wait();
  expect_close("started exchange tag 0", tensors.read(later0), first, 0.0);
  expect_close("started exchange tag 1", tensors.read(later1), second, 0.0);

  auto part = world->split(0, 0, "part");
  CHECK(part->rank() == 0);
  CHECK(part->size() == 1);
  CHECK(part->name() == "part");
  View values = tensors.input(first, ElementType::f32);
  part->all_reduce(values, ReduceOperation::sum);
  expect_close("all_reduce in the split group", tensors.read(values), first, 0.0);
  part->barrier();
}

TEST_CASE("NCCL communicator, one rank: started all-reduces finish on the compute stream's order") {
  // --overlap-grad-reduce's path: each all-reduce runs on the communicator's stream and wait()
  // orders the compute stream after it; an op on the compute stream after wait() reads the
  // result. Three in flight, waited out of order; one dropped unwaited; an empty one.
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  Tensors tensors(*gpu);
  const std::vector<float> values = random_values(4099, 23);
  std::vector<View> buckets;
  std::vector<std::unique_ptr<Communicator::PendingCollective>> pending;
  for (int b = 0; b < 3; ++b) {
    buckets.push_back(tensors.input(values, ElementType::f32));
    pending.push_back(world->start_all_reduce(buckets.back(), ReduceOperation::sum));
  }
  pending[1]->wait();
  pending[2]->wait();
  pending[0]->wait();
  for (const View& bucket : buckets) {
    // A compute-stream op (the scale by 1) after the wait, then the read.
    backend::ops::scale(*gpu, bucket, 1.0);
    expect_close("started all_reduce", tensors.read(bucket), values, 0.0);
  }
  const View dropped = tensors.input(values, ElementType::bf16);
  world->start_all_reduce(dropped, ReduceOperation::sum).reset();
  expect_close("dropped all_reduce", tensors.read(dropped),
               representable(values, ElementType::bf16), 0.0);
  world
      ->start_all_reduce(View{nullptr, 0, ElementType::f32, backend::MemoryKind::cuda},
                         ReduceOperation::sum)
      ->wait();
}

TEST_CASE("NCCL communicator, one rank: blocking calls are ordered on the compute stream") {
  // The host does not wait for a collective: the compute stream waits for it by an event. A
  // chain of 40 all-reduces, each followed by a compute-stream op that doubles the values,
  // read once at the end, gives 2^40 × the values only if every link kept its order.
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  Tensors tensors(*gpu);
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 1e-3f};
  const View chain = tensors.input(values, ElementType::f32);
  for (int link = 0; link < 40; ++link) {
    world->all_reduce(chain, ReduceOperation::sum);
    backend::ops::scale(*gpu, chain, 2.0);
  }
  std::vector<float> expected = values;
  for (float& value : expected) value = std::ldexp(value, 40);  // exact: powers of two
  expect_close("ordered chain", tensors.read(chain), expected, 0.0);
}

TEST_CASE(
    "NCCL communicator, one rank: a started all-gather finishes on the compute stream's order") {
  // --overlap-param-gather's path: the broadcast of this rank's part runs on the communicator's
  // stream, in place and from a separate input; an op on the compute stream after wait() reads
  // the whole.
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  Tensors tensors(*gpu);
  const std::vector<float> values = random_values(3001, 29);
  const int64_t counts[] = {3001};
  const View whole = tensors.input(values, ElementType::f32);
  auto in_place = world->start_all_gather(whole, whole, counts);
  const View output = tensors.input(std::vector<float>(3001, 0.0f), ElementType::bf16);
  const View input = tensors.input(values, ElementType::bf16);
  auto separate = world->start_all_gather(output, input, counts);
  separate->wait();
  in_place->wait();
  backend::ops::scale(*gpu, whole, 1.0);
  expect_close("started all_gather in place", tensors.read(whole), values, 0.0);
  expect_close("started all_gather", tensors.read(output), representable(values, ElementType::bf16),
               0.0);
  const int64_t wrong[] = {3000};
  CHECK_THROWS_WITH_AS(world->start_all_gather(output, input, wrong),
                       doctest::Contains("counts summing to 3000 for a whole of 3001 elements"),
                       common::Error);
}

TEST_CASE("NCCL communicator refuses host memory, a send to itself, bad ranks, tags, colors") {
  auto gpu = open_gpu_or_skip();
  if (!gpu) return;
  auto world = open_nccl_or_skip(*gpu);
  if (!world) return;
  std::vector<float> host = {1.0f, 2.0f};
  CHECK_THROWS_WITH_AS(world->all_reduce(backend::host_view(std::span(host)), ReduceOperation::sum),
                       doctest::Contains("ncclAllReduce in the world group was given host "
                                         "memory (2 elements of fp32)"),
                       common::Error);
  Tensors tensors(*gpu);
  View values = tensors.input({1.0f, 2.0f}, ElementType::f32);
  CHECK_THROWS_WITH_AS(world->send(values, 0), doctest::Contains("to itself would never complete"),
                       common::Error);
  CHECK_THROWS_WITH_AS(world->broadcast(values, 1),
                       "ncclBroadcast in the world group: rank 1 is not one of its 1 members",
                       common::Error);
  const std::vector<PointToPoint> bad_tag = {
      {.direction = PointToPoint::Direction::send, .values = values, .peer = 0, .tag = -1}};
  CHECK_THROWS_WITH_AS(world->exchange(bad_tag), doctest::Contains("tag -1 is not one of 0 to"),
                       common::Error);
  CHECK_THROWS_WITH_AS(world->split(-1, 0, "none"),
                       doctest::Contains("ncclCommSplit in the world group: color -1"),
                       common::Error);
  CHECK_THROWS_WITH_AS(
      backend::make_nccl_communicator(*gpu, backend::make_nccl_unique_id(), 1, 1, "world"),
      doctest::Contains("rank 1 of 1 ranks"), common::Error);
  // The group still works after refusals (nothing was posted).
  world->all_reduce(values, ReduceOperation::sum);
  expect_close("all_reduce after refusals", tensors.read(values), {1.0f, 2.0f}, 0.0);
}
