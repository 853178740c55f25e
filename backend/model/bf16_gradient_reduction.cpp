// The communicator of --grad-reduce-in-bf16; see bf16_gradient_reduction.hpp.
#include "backend/model/bf16_gradient_reduction.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/ops/convert.hpp"

namespace backend {
namespace {

// bf16 scratch buffers, kept for reuse: a step's reductions have the same sizes every step, so
// after the first one nothing is allocated. Shared with the started reductions, which give
// theirs back when they finish.
class ScratchPool {
 public:
  explicit ScratchPool(Device& device) : device_(device) {}
  DeviceMemory take(int64_t bytes) {
    const auto fits = std::find_if(free_.begin(), free_.end(), [&](const DeviceMemory& buffer) {
      return buffer.bytes() >= bytes;
    });
    if (fits != free_.end()) {
      DeviceMemory buffer = std::move(*fits);
      free_.erase(fits);
      return buffer;
    }
    return device_.allocate_zeroed(bytes, "--grad-reduce-in-bf16's bf16 gradients");
  }
  void give_back(DeviceMemory buffer) { free_.push_back(std::move(buffer)); }

 private:
  Device& device_;
  std::vector<DeviceMemory> free_;
};

View bf16_view(const DeviceMemory& buffer, int64_t numel) {
  return View{.data = buffer.data(), .numel = numel, .type = ElementType::bf16, .on = buffer.on()};
}

// One reduction's bf16 side: the fp32 input rounded into pooled scratch, with room after it for
// the bf16 result (or the result over it, in place), and finish(), which widens the result into
// the fp32 output and gives the scratch back (as the destructor does, unwidened, when a started
// reduction is dropped).
class Bf16Copy {
 public:
  Bf16Copy(std::shared_ptr<ScratchPool> pool, Device& device, View output, View input,
           bool in_place)
      : pool_(std::move(pool)), device_(&device), output_(output) {
    const int64_t total = input.numel + (in_place ? 0 : output.numel);
    scratch_ = pool_->take(total * 2);
    const View all = bf16_view(scratch_, total);
    narrow_input_ = all.slice(0, input.numel);
    narrow_output_ = in_place ? narrow_input_ : all.slice(input.numel, output.numel);
    ops::convert(*device_, narrow_input_, input);
  }
  ~Bf16Copy() {
    if (scratch_.data() != nullptr) pool_->give_back(std::move(scratch_));
  }
  Bf16Copy(Bf16Copy&&) = default;
  Bf16Copy(const Bf16Copy&) = delete;
  Bf16Copy& operator=(const Bf16Copy&) = delete;

  View input() const { return narrow_input_; }
  View output() const { return narrow_output_; }
  void finish() {
    if (scratch_.data() == nullptr) return;
    if (output_.numel > 0) ops::convert(*device_, output_, narrow_output_);
    pool_->give_back(std::move(scratch_));
    scratch_ = DeviceMemory();
  }

 private:
  std::shared_ptr<ScratchPool> pool_;
  Device* device_;
  View output_;
  DeviceMemory scratch_;
  View narrow_input_, narrow_output_;
};

class PendingBf16Reduction final : public Communicator::PendingCollective {
 public:
  PendingBf16Reduction(std::unique_ptr<Communicator::PendingCollective> inner, Bf16Copy copy)
      : inner_(std::move(inner)), copy_(std::move(copy)) {}
  ~PendingBf16Reduction() override {
    inner_.reset();  // finishes the reduction before copy_ gives its buffer back for reuse
  }
  PendingBf16Reduction(const PendingBf16Reduction&) = delete;
  PendingBf16Reduction& operator=(const PendingBf16Reduction&) = delete;
  void wait() override {
    inner_->wait();
    copy_.finish();
  }

 private:
  std::unique_ptr<Communicator::PendingCollective> inner_;
  Bf16Copy copy_;
};

class Bf16GradientReduction final : public Communicator {
 public:
  Bf16GradientReduction(Communicator& group, Device& device)
      : group_(group), device_(device), pool_(std::make_shared<ScratchPool>(device)) {}

  int64_t rank() const override { return group_.rank(); }
  int64_t size() const override { return group_.size(); }
  std::string name() const override { return group_.name(); }
  bool queued_on_device() const override { return group_.queued_on_device(); }
  void watch_queued_work(const std::string& what) override { group_.watch_queued_work(what); }

  void all_reduce(View values, ReduceOperation operation) override {
    if (!reduced_in_bf16(values)) {
      group_.all_reduce(values, operation);
      return;
    }
    Bf16Copy copy(pool_, device_, values, values, true);
    group_.all_reduce(copy.output(), operation);
    copy.finish();
  }

  void reduce_scatter(View output, View input) override {
    if (!reduced_in_bf16(input)) {
      group_.reduce_scatter(output, input);
      return;
    }
    same_type(output, input, "reduce_scatter");
    Bf16Copy copy(pool_, device_, output, input, false);
    group_.reduce_scatter(copy.output(), copy.input());
    copy.finish();
  }

  std::unique_ptr<PendingCollective> start_all_reduce(View values,
                                                      ReduceOperation operation) override {
    if (!reduced_in_bf16(values)) return group_.start_all_reduce(values, operation);
    Bf16Copy copy(pool_, device_, values, values, true);
    auto inner = group_.start_all_reduce(copy.output(), operation);
    return std::make_unique<PendingBf16Reduction>(std::move(inner), std::move(copy));
  }

  std::unique_ptr<PendingCollective> start_reduce_scatter(
      View output, View input, std::span<const int64_t> counts) override {
    if (!reduced_in_bf16(input)) return group_.start_reduce_scatter(output, input, counts);
    same_type(output, input, "start_reduce_scatter");
    Bf16Copy copy(pool_, device_, output, input, false);
    auto inner = group_.start_reduce_scatter(copy.output(), copy.input(), counts);
    return std::make_unique<PendingBf16Reduction>(std::move(inner), std::move(copy));
  }

  void all_gather(View output, View input) override { group_.all_gather(output, input); }
  std::unique_ptr<PendingCollective> start_all_gather(View output, View input,
                                                      std::span<const int64_t> counts) override {
    return group_.start_all_gather(output, input, counts);
  }
  void broadcast(View values, int64_t root) override { group_.broadcast(values, root); }
  void send(View values, int64_t peer) override { group_.send(values, peer); }
  void receive(View values, int64_t peer) override { group_.receive(values, peer); }
  void exchange(std::span<const PointToPoint> transfers) override { group_.exchange(transfers); }
  void barrier() override { group_.barrier(); }
  std::unique_ptr<Communicator> split(int64_t, int64_t, std::string) override {
    common::fail(
        "the {} group's --grad-reduce-in-bf16 reduction is not split: split the group "
        "it reduces over",
        group_.name());
  }

 private:
  // fp32 views with elements; the empty and the other types pass through.
  static bool reduced_in_bf16(const View& values) {
    return values.type == ElementType::f32 && values.numel > 0;
  }

  Communicator& group_;
  Device& device_;
  std::shared_ptr<ScratchPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_bf16_gradient_reduction(Communicator& group, Device& device) {
  return std::make_unique<Bf16GradientReduction>(group, device);
}

}  // namespace backend
