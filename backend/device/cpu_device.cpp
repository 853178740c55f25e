// CpuDevice: the process's own memory. Its fill_zero writes fp32, fp64, bf16, fp16 and int32
// zeros (all-zero bits, +0 in each type): a memory operation, no arithmetic, so the 16-bit types
// the conversions write (ZeRO-3's gathered working copies) are zeroed here too. A capture
// records the ops and the device's copies and fills (cpu_device.hpp).
#include "backend/device/cpu_device.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {
namespace {

void release_host(void* data, int64_t bytes) noexcept { munmap(data, static_cast<size_t>(bytes)); }

void* map_anonymous(int64_t bytes, std::string_view what) {
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    common::fail("out of host memory allocating {} bytes for {}: {}", bytes, what,
                 std::strerror(errno));
  }
  return data;
}

// Zeros of any element type: all-zero bits, written as a type of the element's size.
void zero_host(View values) {
  auto zero = [&](auto scalar) {
    using S = decltype(scalar);
    host_bytes(values);
    S* data = static_cast<S*>(values.data);  // a type of the view's element size
    const int64_t count = values.numel;
    // Half a gigabyte of gradients at the 126M shape: one core alone does not reach the
    // memory bandwidth.
#pragma omp parallel for simd schedule(static) if (count > (1 << 16))
    for (int64_t i = 0; i < count; ++i) data[i] = S{0};
  };
  switch (values.type) {
    case ElementType::f32:
      zero(float{});
      return;
    case ElementType::f64:
      zero(double{});
      return;
    case ElementType::bf16:
    case ElementType::f16:
      zero(uint16_t{});
      return;
    case ElementType::i32:
      zero(int32_t{});
      return;
    case ElementType::u64:
      zero(uint64_t{});
      return;
  }
  common::fail("fill_zero: no element type {}", static_cast<int>(values.type));
}

// The recorded work of a capture, run again at each replay.
class HostGraph final : public DeviceGraph {
 public:
  explicit HostGraph(std::unique_ptr<HostOpRecording> recording)
      : recording_(std::move(recording)) {}
  void replay() override { recording_->run(); }
  int64_t nodes() const override { return recording_->calls(); }

 private:
  std::unique_ptr<HostOpRecording> recording_;
};

}  // namespace

// Anonymous pages: aligned to the page (more than an arena's 256 bytes), and zeroed by the
// kernel when first touched, by whichever thread touches them, so carving a large arena costs
// no pass over it and the first writer's NUMA node gets the page.
DeviceMemory CpuDevice::allocate_zeroed(int64_t bytes, std::string_view what) {
  refuse_in_capture("allocate_zeroed");
  if (bytes == 0) return {};
  return DeviceMemory(map_anonymous(bytes, what), bytes, MemoryKind::host, release_host, &ledger_);
}

DeviceMemory CpuDevice::allocate_pinned_host(int64_t bytes, std::string_view what) {
  refuse_in_capture("allocate_pinned_host");
  if (bytes == 0) return {};
  return DeviceMemory(map_anonymous(bytes, what), bytes, MemoryKind::host, release_host);
}

void CpuDevice::copy_from_host(View destination, const void* source) {
  refuse_in_capture("copy_from_host");
  if (destination.bytes() > 0) std::memcpy(host_bytes(destination), source, destination.bytes());
}

void CpuDevice::copy_to_host(void* destination, View source) {
  refuse_in_capture("copy_to_host");
  if (source.bytes() > 0) std::memcpy(destination, host_bytes(source), source.bytes());
}

void CpuDevice::queue_copy_to_host(void* destination, View source) {
  refuse_in_capture("queue_copy_to_host");
  copy_to_host(destination, source);
}

// Bytes of any element type (bf16 too: nothing is computed). memmove: the same view is allowed.
void CpuDevice::copy(View destination, View source) {
  check_same_extent(destination, source, "copy");
  void* to = host_bytes(destination);
  const void* from = host_bytes(source);
  if (to == from || source.bytes() == 0) return;
  const auto bytes = static_cast<size_t>(source.bytes());
  if (recording_ != nullptr) {
    recording_->add([to, from, bytes] { std::memmove(to, from, bytes); });
  } else {
    std::memmove(to, from, bytes);
  }
}

void CpuDevice::fill_zero(View values) {
  if (recording_ == nullptr) {
    zero_host(values);
    return;
  }
  // Checked now, as a stream capture checks its arguments.
  if (values.bytes() > 0) host_bytes(values);
  recording_->add([values] { zero_host(values); });
}

void* CpuDevice::scratch(int64_t bytes, std::string_view /*op*/) {
  const auto words = static_cast<size_t>((bytes + int64_t{sizeof(std::max_align_t)} - 1) /
                                         int64_t{sizeof(std::max_align_t)});
  if (scratch_.size() < words) scratch_.resize(words);
  return scratch_.data();
}

void CpuDevice::begin_capture() {
  if (recording_ != nullptr) common::fail("begin_capture: cpu is capturing already");
  recording_ = std::make_unique<HostOpRecording>();
}

std::unique_ptr<DeviceGraph> CpuDevice::end_capture() {
  if (recording_ == nullptr) common::fail("end_capture: cpu is not capturing");
  return std::make_unique<HostGraph>(std::move(recording_));
}

const CudaContext& CpuDevice::cuda_context() {
  common::fail("cpu is not a CUDA device: it has no stream or CUDA handles (a CUDA twin was "
               "called with host memory)");
}

}  // namespace backend
