// The routed communicator's choice of route (backend/dist/staged_communicator.hpp), seen through
// two recording communicators: GPU views go the device way, host views and barriers the host
// way, a call mixing them is refused, as are routes of different groups; and the staged
// communicator refuses a view in the memory it does not carry. Every collective on real ranks,
// staged and routed: tests/mpi/staged_communicator_test.cpp.
#include "backend/dist/staged_communicator.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"

using backend::Communicator;
using backend::MemoryKind;
using backend::PointToPoint;
using backend::ReduceOperation;
using backend::View;

namespace {

// Appends "<route> <call>" to a shared log for each call; moves nothing (its views are never
// read, so GPU views need no GPU).
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(std::string route, std::vector<std::string>& log, int64_t rank = 1,
                        int64_t size = 4)
      : route_(std::move(route)), log_(log), rank_(rank), size_(size) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return "data parallel"; }
  void all_reduce(View, ReduceOperation) override { note("all_reduce"); }
  void reduce_scatter(View, View) override { note("reduce_scatter"); }
  std::unique_ptr<PendingCollective> start_reduce_scatter(View, View,
                                                          std::span<const int64_t>) override {
    note("start_reduce_scatter");
    return backend::finished_collective();
  }
  void all_gather(View, View) override { note("all_gather"); }
  std::unique_ptr<PendingCollective> start_all_gather(View, View,
                                                      std::span<const int64_t>) override {
    note("start_all_gather");
    return backend::finished_collective();
  }
  void broadcast(View, int64_t) override { note("broadcast"); }
  void send(View, int64_t) override { note("send"); }
  void receive(View, int64_t) override { note("receive"); }
  void exchange(std::span<const PointToPoint>) override { note("exchange"); }
  void barrier() override { note("barrier"); }
  void watch_queued_work(const std::string&) override { note("watch_queued_work"); }
  std::unique_ptr<Communicator> split(int64_t, int64_t, std::string) override {
    note("split");
    return std::make_unique<RecordingCommunicator>(route_, log_, 0, 2);
  }

 private:
  void note(const char* call) { log_.push_back(route_ + " " + call); }
  std::string route_;
  std::vector<std::string>& log_;
  int64_t rank_, size_;
};

View gpu_view(int64_t numel) {
  static float never_read[64];
  return View{.data = never_read,
              .numel = numel,
              .type = backend::ElementType::f32,
              .on = MemoryKind::cuda};
}

}  // namespace

TEST_CASE("a routed communicator sends GPU memory the device way and host memory the host way") {
  std::vector<std::string> log;
  auto routed =
      backend::make_routed_communicator(std::make_unique<RecordingCommunicator>("device", log),
                                        std::make_unique<RecordingCommunicator>("host", log));
  CHECK(routed->rank() == 1);
  CHECK(routed->size() == 4);
  CHECK(routed->name() == "data parallel");
  std::vector<double> scalars = {1.0, 2.0};
  const View host = backend::host_view(std::span(scalars));
  routed->all_reduce(gpu_view(8), ReduceOperation::sum);
  routed->all_reduce(host, ReduceOperation::max);
  routed->reduce_scatter(gpu_view(2), gpu_view(8));
  const int64_t counts[] = {2, 3, 0, 3};
  routed->start_reduce_scatter(gpu_view(3), gpu_view(8), counts)->wait();
  routed->all_gather(gpu_view(8), gpu_view(8).slice(2, 2));
  routed->all_gather(host, host.slice(1, 1));
  routed->start_all_gather(gpu_view(8), gpu_view(8).slice(2, 3), counts)->wait();
  routed->broadcast(host, 0);
  routed->send(gpu_view(4), 2);
  routed->receive(host, 2);
  // An absent view follows the others; a batch of GPU views goes the device way.
  routed->all_gather(gpu_view(8), View{});
  const std::vector<PointToPoint> batch = {
      {.direction = PointToPoint::Direction::send, .values = gpu_view(4), .peer = 2, .tag = 0},
      {.direction = PointToPoint::Direction::receive, .values = gpu_view(4), .peer = 0, .tag = 0}};
  routed->exchange(batch);
  routed->barrier();
  routed->watch_queued_work("a replayed step's update");
  const std::unique_ptr<Communicator> half = routed->split(1, 1, "half");
  half->all_reduce(gpu_view(1), ReduceOperation::sum);
  CHECK(half->size() == 2);
  CHECK(log == std::vector<std::string>{
                   "device all_reduce", "host all_reduce", "device reduce_scatter",
                   "device start_reduce_scatter", "device all_gather", "host all_gather",
                   "device start_all_gather", "host broadcast", "device send", "host receive",
                   "device all_gather", "device exchange", "host barrier",
                   "device watch_queued_work", "device split", "host split", "device all_reduce"});
}

TEST_CASE("a routed call mixing GPU and host memory, or routes of two groups, are refused") {
  std::vector<std::string> log;
  auto routed =
      backend::make_routed_communicator(std::make_unique<RecordingCommunicator>("device", log),
                                        std::make_unique<RecordingCommunicator>("host", log));
  std::vector<float> own(2);
  CHECK_THROWS_WITH_AS(routed->all_gather(gpu_view(8), backend::host_view(std::span(own))),
                       "all_gather in the data parallel group mixes GPU and host memory; its "
                       "views must all be in one",
                       common::Error);
  const std::vector<PointToPoint> mixed = {
      {.direction = PointToPoint::Direction::send, .values = gpu_view(2), .peer = 2, .tag = 0},
      {.direction = PointToPoint::Direction::receive,
       .values = backend::host_view(std::span(own)),
       .peer = 0,
       .tag = 0}};
  CHECK_THROWS_WITH_AS(routed->exchange(mixed),
                       "exchange in the data parallel group mixes GPU and host memory; its views "
                       "must all be in one",
                       common::Error);
  CHECK(log.empty());
  CHECK_THROWS_WITH_AS(
      backend::make_routed_communicator(
          std::make_unique<RecordingCommunicator>("device", log, 1, 4),
          std::make_unique<RecordingCommunicator>("host", log, 1, 2)),
      "the data parallel group's device route is rank 1 of 4, its host route rank 1 of 2: both "
      "must be made by the same splits of one layout",
      common::Error);
}

TEST_CASE("a staged communicator refuses a view in the memory it does not carry") {
  backend::CpuDevice device;
  auto through_host = backend::make_staged_communicator(
      backend::make_single_process_communicator("tensor model parallel"), device,
      backend::StagingMemory::host);
  CHECK_THROWS_WITH_AS(through_host->all_reduce(gpu_view(4), ReduceOperation::sum),
                       "all_reduce in the tensor model parallel group (staged through host "
                       "memory) was given GPU memory; it carries host memory",
                       common::Error);
  // On the CPU device the staging is a copy: a one-process group's identity, through it.
  std::vector<float> values = {1.5f, -2.0f, 3.0f};
  std::vector<float> shard = {0.0f};
  through_host->all_reduce(backend::host_view(std::span(values)), ReduceOperation::sum);
  through_host->all_gather(backend::host_view(std::span(values)),
                           backend::host_view(std::span(values)));
  through_host->reduce_scatter(backend::host_view(std::span(shard)),
                               backend::host_view(std::span(values)).slice(1, 1));
  CHECK(values == std::vector<float>{1.5f, -2.0f, 3.0f});
  CHECK(shard == std::vector<float>{-2.0f});
}
