// Collectives in a capturing device's order; see captured_collectives.hpp.
#include "backend/dist/captured_collectives.hpp"

#include <fmt/format.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"

namespace backend {
namespace {

class CapturedCollectives final : public Communicator {
 public:
  CapturedCollectives(Communicator& inner, Device& device) : inner_(inner), device_(device) {}

  int64_t rank() const override { return inner_.rank(); }
  int64_t size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  bool queued_on_device() const override { return inner_.queued_on_device(); }
  void watch_queued_work(const std::string& what) override { inner_.watch_queued_work(what); }

  void all_reduce(View values, ReduceOperation operation) override {
    in_order([&inner = inner_, values, operation] { inner.all_reduce(values, operation); });
  }
  void reduce_scatter(View output, View input) override {
    in_order([&inner = inner_, output, input] { inner.reduce_scatter(output, input); });
  }
  void all_gather(View output, View input) override {
    in_order([&inner = inner_, output, input] { inner.all_gather(output, input); });
  }
  void broadcast(View values, int64_t root) override {
    in_order([&inner = inner_, values, root] { inner.broadcast(values, root); });
  }
  void send(View values, int64_t peer) override {
    in_order([&inner = inner_, values, peer] { inner.send(values, peer); });
  }
  void receive(View values, int64_t peer) override {
    in_order([&inner = inner_, values, peer] { inner.receive(values, peer); });
  }
  void exchange(std::span<const PointToPoint> transfers) override {
    in_order([&inner = inner_, batch = std::vector<PointToPoint>(
                                   transfers.begin(), transfers.end())] { inner.exchange(batch); });
  }
  void barrier() override {
    refuse_while_capturing("barrier (the host waits for every member)");
    inner_.barrier();
  }

  std::unique_ptr<PendingCollective> start_all_reduce(View values,
                                                      ReduceOperation operation) override {
    return started(
        [&inner = inner_, values, operation] { return inner.start_all_reduce(values, operation); });
  }
  std::unique_ptr<PendingCollective> start_exchange(
      std::span<const PointToPoint> transfers) override {
    return started(
        [&inner = inner_, batch = std::vector<PointToPoint>(transfers.begin(), transfers.end())] {
          return inner.start_exchange(batch);
        });
  }
  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    return started([&inner = inner_, output, input,
                    parts = std::vector<int64_t>(counts.begin(), counts.end())] {
      return inner.start_reduce_scatter(output, input, parts);
    });
  }
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    return started([&inner = inner_, output, input,
                    parts = std::vector<int64_t>(counts.begin(), counts.end())] {
      return inner.start_all_gather(output, input, parts);
    });
  }

  std::unique_ptr<Communicator> split(int64_t, int64_t, std::string) override {
    common::fail("the {} group's captured collectives are not split: split the group itself",
                 inner_.name());
  }

 private:
  HostOpRecording* recording() { return device_.host_recording(); }

  // Recorded in the host device's capture, else run now (a GPU's capture holds what the
  // inner communicator queues on its streams). A recorded call holds the inner communicator,
  // not this one, which may be gone by the time the recording replays.
  void in_order(std::function<void()> call) {
    if (HostOpRecording* host = recording()) {
      host->add(std::move(call));
    } else {
      call();
    }
  }

  // A started call: recorded as two calls of the recording, the start in its place and the
  // wait where the caller waits (RecordedStart), so that the replay overlaps what the eager
  // step overlaps and waits where it waits; else started now.
  using Handle = std::shared_ptr<std::unique_ptr<PendingCollective>>;
  template <typename Start>
  std::unique_ptr<PendingCollective> started(Start start) {
    HostOpRecording* host = recording();
    if (host == nullptr) return start();
    auto handle = std::make_shared<std::unique_ptr<PendingCollective>>();
    host->add([handle, start] { *handle = start(); });
    return std::make_unique<RecordedStart>(device_, *host, std::move(handle), inner_.name());
  }

  // The pending half of a recorded start: wait() records the wait of the call the replay
  // started (and releases it), in the same recording; a wait after that recording ended is
  // refused (the replay would never wait for it), and one dropped unwaited records its wait
  // where it was dropped, as a dropped pending call finishes.
  class RecordedStart final : public PendingCollective {
   public:
    RecordedStart(Device& device, HostOpRecording& recording, Handle handle, std::string group)
        : device_(device),
          recording_(recording),
          handle_(std::move(handle)),
          group_(std::move(group)) {}
    ~RecordedStart() override {
      if (!waited_ && device_.host_recording() == &recording_) record_wait();
    }
    RecordedStart(const RecordedStart&) = delete;
    RecordedStart& operator=(const RecordedStart&) = delete;
    void wait() override {
      if (waited_) return;
      if (device_.host_recording() != &recording_) {
        common::fail(
            "a collective of the {} group started in a capture was waited for after the "
            "capture ended; its wait belongs to the captured work",
            group_);
      }
      record_wait();
    }

   private:
    void record_wait() {
      waited_ = true;
      recording_.add([handle = handle_] {
        if (*handle) {
          (*handle)->wait();
          handle->reset();
        }
      });
    }
    Device& device_;
    HostOpRecording& recording_;
    Handle handle_;
    std::string group_;
    bool waited_ = false;
  };

  void refuse_while_capturing(const char* call) const {
    if (device_.capturing()) {
      common::fail("{} in the {} group: a capture on {} cannot hold it", call, inner_.name(),
                   device_.name());
    }
  }

  Communicator& inner_;
  Device& device_;
};

}  // namespace

std::unique_ptr<Communicator> make_captured_collectives(Communicator& inner, Device& device) {
  return std::make_unique<CapturedCollectives>(inner, device);
}

bool keeps_capture_order(const Communicator& group) {
  return dynamic_cast<const CapturedCollectives*>(&group) != nullptr;
}

std::optional<std::string> collectives_capture_refusal(const Communicator& group,
                                                       const Device& device) {
  if (group.size() == 1 || device.memory_kind() == MemoryKind::host) return std::nullopt;
  if (group.queued_on_device()) return std::nullopt;
  return fmt::format(
      "the {} group's collectives are staged through host memory by the host "
      "(--distributed-backend gloo); a capture holds NCCL's (--distributed-backend nccl)",
      group.name());
}

}  // namespace backend
