// The staged and routed communicators; see staged_communicator.hpp.
#include "backend/dist/staged_communicator.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"

namespace backend {
namespace {

const char* memory_name(MemoryKind on) {
  return on == MemoryKind::cuda ? "GPU" : "host";
}

// Each staged view starts on a 256-byte boundary, as an arena's (any element type, any vector
// load of the copies).
constexpr int64_t kStagingAlignment = 256;

int64_t aligned(int64_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Device& device, StagingMemory inner_reads)
      : inner_(std::move(inner)), device_(device), inner_reads_(inner_reads) {}

  int64_t rank() const override { return inner_->rank(); }
  int64_t size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }

  void all_reduce(View values, ReduceOperation operation) override {
    const std::vector<View> staged = stage({values}, "all_reduce");
    copy_in(staged[0], values);
    inner_->all_reduce(staged[0], operation);
    copy_out(values, staged[0]);
  }

  void reduce_scatter(View output, View input) override {
    const std::vector<View> staged = stage({input, output}, "reduce_scatter");
    copy_in(staged[0], input);
    inner_->reduce_scatter(staged[1], staged[0]);
    copy_out(output, staged[1]);
  }

  // Run at once through the inner communicator (a staged call is blocking).
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    const std::vector<View> staged = stage({input, output}, "start_reduce_scatter");
    copy_in(staged[0], input);
    inner_->start_reduce_scatter(staged[1], staged[0], counts)->wait();
    copy_out(output, staged[1]);
    return finished_collective();
  }

  void all_gather(View output, View input) override {
    staged_gather(output, input, "all_gather", [&](View output_staged, View input_staged) {
      inner_->all_gather(output_staged, input_staged);
    });
  }

  // Run at once through the inner communicator (a staged call is blocking).
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    staged_gather(output, input, "start_all_gather", [&](View output_staged, View input_staged) {
      inner_->start_all_gather(output_staged, input_staged, counts)->wait();
    });
    return finished_collective();
  }

  void broadcast(View values, int64_t root) override {
    check_member(root, "broadcast");
    const std::vector<View> staged = stage({values}, "broadcast");
    if (rank() == root) copy_in(staged[0], values);
    inner_->broadcast(staged[0], root);
    if (rank() != root) copy_out(values, staged[0]);
  }

  void send(View values, int64_t peer) override {
    const std::vector<View> staged = stage({values}, "send");
    copy_in(staged[0], values);
    inner_->send(staged[0], peer);
  }

  void receive(View values, int64_t peer) override {
    const std::vector<View> staged = stage({values}, "receive");
    inner_->receive(staged[0], peer);
    copy_out(values, staged[0]);
  }

  void exchange(std::span<const PointToPoint> transfers) override {
    std::vector<View> views;
    views.reserve(transfers.size());
    for (const PointToPoint& transfer : transfers) views.push_back(transfer.values);
    const std::vector<View> staged = stage(views, "exchange");
    std::vector<PointToPoint> inner_transfers(transfers.begin(), transfers.end());
    for (size_t i = 0; i < transfers.size(); ++i) {
      inner_transfers[i].values = staged[i];
      if (transfers[i].direction == PointToPoint::Direction::send) {
        copy_in(staged[i], transfers[i].values);
      }
    }
    inner_->exchange(inner_transfers);
    for (size_t i = 0; i < transfers.size(); ++i) {
      if (transfers[i].direction == PointToPoint::Direction::receive) {
        copy_out(transfers[i].values, staged[i]);
      }
    }
  }

  void barrier() override { inner_->barrier(); }

  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    return std::make_unique<StagedCommunicator>(inner_->split(color, key, std::move(name)), device_,
                                                inner_reads_);
  }

 private:
  // An all-gather through the staging: run(staged output, staged input). In place (input inside
  // output, the member's own part) stays in place in the staging, so the inner communicator sees
  // the call its caller made.
  template <typename Run>
  void staged_gather(View output, View input, const char* call, Run run) {
    const auto* output_begin = static_cast<const std::byte*>(output.data);
    const auto* input_begin = static_cast<const std::byte*>(input.data);
    const bool in_place = !input.empty() && input.type == output.type &&
                          input_begin >= output_begin &&
                          input_begin + input.bytes() <= output_begin + output.bytes();
    if (in_place) {
      const std::vector<View> staged = stage({output}, call);
      const View part =
          staged[0].slice((input_begin - output_begin) / element_size(input.type), input.numel);
      copy_in(part, input);
      run(staged[0], part);
      copy_out(output, staged[0]);
      return;
    }
    const std::vector<View> staged = stage({output, input}, call);
    copy_in(staged[1], input);
    run(staged[0], staged[1]);
    copy_out(output, staged[0]);
  }
  // The memory the callers' views are in: the one the inner communicator does not read.
  MemoryKind caller_memory() const {
    return inner_reads_ == StagingMemory::host ? device_.memory_kind() : MemoryKind::host;
  }

  // A staging view of the inner memory for each of `views` (same type and count), laid out one
  // after another in the staging buffer, which grows to hold them. Waits first for copies still
  // reading the staging (the last call's results going back to the device).
  std::vector<View> stage(const std::vector<View>& views, const char* call) {
    int64_t total = 0;
    for (const View& view : views) {
      if (!view.empty() && view.on != caller_memory()) {
        common::fail(
            "{} in the {} group (staged through {} memory) was given {} memory; it "
            "carries {} memory",
            call, name(), inner_reads_ == StagingMemory::host ? "host" : "device",
            memory_name(view.on), memory_name(caller_memory()));
      }
      total += aligned(view.bytes());
    }
    if (copies_back_queued_) {
      device_.synchronize();
      copies_back_queued_ = false;
    }
    if (total > buffer_.bytes()) {
      // Doubling: a run's calls settle on a few sizes, so the buffer stops growing early.
      const int64_t bytes = std::max(total, 2 * buffer_.bytes());
      buffer_ = DeviceMemory();  // the old buffer goes before the new one is taken
      buffer_ = inner_reads_ == StagingMemory::host
                    ? device_.allocate_pinned_host(bytes, "the collectives' host staging")
                    : device_.allocate_zeroed(bytes, "the host collectives' device staging");
    }
    std::vector<View> staged;
    staged.reserve(views.size());
    int64_t offset = 0;
    for (const View& view : views) {
      staged.push_back(View{.data = static_cast<std::byte*>(buffer_.data()) + offset,
                            .numel = view.numel,
                            .type = view.type,
                            .on = buffer_.on()});
      offset += aligned(view.bytes());
    }
    return staged;
  }

  void copy_in(View staged, View values) {
    if (inner_reads_ == StagingMemory::host) {
      device_.copy_to_host(staged.data, values);
    } else {
      device_.copy_from_host(staged, values.data);
    }
  }

  void copy_out(View values, View staged) {
    if (inner_reads_ == StagingMemory::host) {
      device_.copy_from_host(values, staged.data);
      copies_back_queued_ = true;
    } else {
      device_.copy_to_host(values.data, staged);
    }
  }

  std::unique_ptr<Communicator> inner_;
  Device& device_;
  StagingMemory inner_reads_;
  DeviceMemory buffer_;
  bool copies_back_queued_ = false;
};

class RoutedCommunicator final : public Communicator {
 public:
  RoutedCommunicator(std::unique_ptr<Communicator> device_path,
                     std::unique_ptr<Communicator> host_path)
      : device_path_(std::move(device_path)), host_path_(std::move(host_path)) {
    if (device_path_->rank() != host_path_->rank() || device_path_->size() != host_path_->size()) {
      common::fail(
          "the {} group's device route is rank {} of {}, its host route rank {} of {}: "
          "both must be made by the same splits of one layout",
          host_path_->name(), device_path_->rank(), device_path_->size(), host_path_->rank(),
          host_path_->size());
    }
  }

  int64_t rank() const override { return host_path_->rank(); }
  int64_t size() const override { return host_path_->size(); }
  std::string name() const override { return host_path_->name(); }
  bool queued_on_device() const override { return device_path_->queued_on_device(); }
  void watch_queued_work(const std::string& what) override {
    device_path_->watch_queued_work(what);
  }

  void all_reduce(View values, ReduceOperation operation) override {
    route({values}, "all_reduce").all_reduce(values, operation);
  }
  void reduce_scatter(View output, View input) override {
    route({output, input}, "reduce_scatter").reduce_scatter(output, input);
  }
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    return route({output, input}, "start_reduce_scatter")
        .start_reduce_scatter(output, input, counts);
  }
  void all_gather(View output, View input) override {
    route({output, input}, "all_gather").all_gather(output, input);
  }
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    return route({output, input}, "start_all_gather").start_all_gather(output, input, counts);
  }
  void broadcast(View values, int64_t root) override {
    route({values}, "broadcast").broadcast(values, root);
  }
  void send(View values, int64_t peer) override { route({values}, "send").send(values, peer); }
  void receive(View values, int64_t peer) override {
    route({values}, "receive").receive(values, peer);
  }
  void exchange(std::span<const PointToPoint> transfers) override {
    route(views_of(transfers), "exchange").exchange(transfers);
  }
  std::unique_ptr<PendingCollective> start_exchange(
      std::span<const PointToPoint> transfers) override {
    return route(views_of(transfers), "start_exchange").start_exchange(transfers);
  }
  void barrier() override { host_path_->barrier(); }
  std::unique_ptr<Communicator> split(int64_t color, int64_t key, std::string name) override {
    std::unique_ptr<Communicator> device_path = device_path_->split(color, key, name);
    return std::make_unique<RoutedCommunicator>(std::move(device_path),
                                                host_path_->split(color, key, std::move(name)));
  }

 private:
  static std::vector<View> views_of(std::span<const PointToPoint> transfers) {
    std::vector<View> views;
    for (const PointToPoint& transfer : transfers) views.push_back(transfer.values);
    return views;
  }

  // Empty views (an absent shard) live nowhere and follow the others; a call of empty views
  // only goes the host way (it moves nothing).
  Communicator& route(const std::vector<View>& views, const char* call) {
    bool on_gpu = false, on_host = false;
    for (const View& view : views) {
      if (view.empty()) continue;
      (view.on == MemoryKind::cuda ? on_gpu : on_host) = true;
    }
    if (on_gpu && on_host) {
      common::fail("{} in the {} group mixes GPU and host memory; its views must all be in one",
                   call, name());
    }
    return on_gpu ? *device_path_ : *host_path_;
  }

  std::unique_ptr<Communicator> device_path_;
  std::unique_ptr<Communicator> host_path_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       Device& device, StagingMemory inner_reads) {
  return std::make_unique<StagedCommunicator>(std::move(inner), device, inner_reads);
}

std::unique_ptr<Communicator> make_routed_communicator(std::unique_ptr<Communicator> device_path,
                                                       std::unique_ptr<Communicator> host_path) {
  return std::make_unique<RoutedCommunicator>(std::move(device_path), std::move(host_path));
}

}  // namespace backend
