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

class PendingBf16Reduction final : public Communicator::PendingReduction {
 public:
  // `narrow`: where in `scratch` the bf16 sums land, widened into `values` at wait().
  PendingBf16Reduction(std::unique_ptr<Communicator::PendingReduction> inner, Device& device,
                       View values, View narrow, DeviceMemory scratch,
                       std::shared_ptr<ScratchPool> pool)
      : inner_(std::move(inner)),
        device_(device),
        values_(values),
        narrow_(narrow),
        scratch_(std::move(scratch)),
        pool_(std::move(pool)) {}
  ~PendingBf16Reduction() override {
    inner_.reset();  // finishes the reduction before its buffer is reused
    if (scratch_.data() != nullptr) pool_->give_back(std::move(scratch_));
  }
  PendingBf16Reduction(const PendingBf16Reduction&) = delete;
  PendingBf16Reduction& operator=(const PendingBf16Reduction&) = delete;
  void wait() override {
    if (scratch_.data() == nullptr) return;
    inner_->wait();
    if (values_.numel > 0) ops::convert(device_, values_, narrow_);
    pool_->give_back(std::move(scratch_));
    scratch_ = DeviceMemory();
  }

 private:
  std::unique_ptr<Communicator::PendingReduction> inner_;
  Device& device_;
  View values_, narrow_;
  DeviceMemory scratch_;
  std::shared_ptr<ScratchPool> pool_;
};

class Bf16GradientReduction final : public Communicator {
 public:
  Bf16GradientReduction(Communicator& group, Device& device)
      : group_(group), device_(device), pool_(std::make_shared<ScratchPool>(device)) {}

  int64_t rank() const override { return group_.rank(); }
  int64_t size() const override { return group_.size(); }
  std::string name() const override { return group_.name(); }

  void all_reduce(View values, ReduceOperation operation) override {
    if (!reduced_in_bf16(values)) {
      group_.all_reduce(values, operation);
      return;
    }
    DeviceMemory scratch = pool_->take(values.numel * 2);
    const View narrow = bf16_view(scratch, values.numel);
    ops::convert(device_, narrow, values);
    group_.all_reduce(narrow, operation);
    ops::convert(device_, values, narrow);
    pool_->give_back(std::move(scratch));
  }

  void reduce_scatter(View output, View input) override {
    if (!reduced_in_bf16(input)) {
      group_.reduce_scatter(output, input);
      return;
    }
    same_type(output, input, "reduce_scatter");
    DeviceMemory scratch = pool_->take((input.numel + output.numel) * 2);
    const View narrow_input = bf16_view(scratch, input.numel + output.numel).slice(0, input.numel);
    const View narrow_output =
        bf16_view(scratch, input.numel + output.numel).slice(input.numel, output.numel);
    ops::convert(device_, narrow_input, input);
    group_.reduce_scatter(narrow_output, narrow_input);
    ops::convert(device_, output, narrow_output);
    pool_->give_back(std::move(scratch));
  }

  std::unique_ptr<PendingReduction> start_all_reduce(View values,
                                                     ReduceOperation operation) override {
    if (!reduced_in_bf16(values)) return group_.start_all_reduce(values, operation);
    DeviceMemory scratch = pool_->take(values.numel * 2);
    const View narrow = bf16_view(scratch, values.numel);
    ops::convert(device_, narrow, values);
    auto inner = group_.start_all_reduce(narrow, operation);
    return std::make_unique<PendingBf16Reduction>(std::move(inner), device_, values, narrow,
                                                  std::move(scratch), pool_);
  }

  std::unique_ptr<PendingReduction> start_reduce_scatter(View output, View input,
                                                         std::span<const int64_t> counts) override {
    if (!reduced_in_bf16(input)) return group_.start_reduce_scatter(output, input, counts);
    same_type(output, input, "start_reduce_scatter");
    const int64_t total = input.numel + output.numel;
    DeviceMemory scratch = pool_->take(total * 2);
    const View narrow_input = bf16_view(scratch, total).slice(0, input.numel);
    const View narrow_output = bf16_view(scratch, total).slice(input.numel, output.numel);
    ops::convert(device_, narrow_input, input);
    auto inner = group_.start_reduce_scatter(narrow_output, narrow_input, counts);
    return std::make_unique<PendingBf16Reduction>(std::move(inner), device_, output, narrow_output,
                                                  std::move(scratch), pool_);
  }

  void all_gather(View output, View input) override { group_.all_gather(output, input); }
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
