// CpuDevice: the Device whose memory is the process's own, on which the ops run their CPU twins
// (backend/ops/*_cpu.cpp) in fp32 or fp64: the reference every other device is checked
// against. Memory is anonymous pages the kernel zeroes on first touch
// (common/lazy_zero_allocator.hpp explains why that matters for the parameters).
// Capture (device.hpp) records the ops' twin calls and the device's copies and fills in a
// HostOpRecording, run again by each replay: the CPU's stand-in for a CUDA graph, with the
// same refusals a stream capture has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "backend/device/device.hpp"

namespace backend {

class CpuDevice : public Device {
 public:
  std::string name() const override { return "cpu"; }
  MemoryKind memory_kind() const override { return MemoryKind::host; }

  DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) override;
  MemoryUsage memory_usage() const override { return ledger_.usage(); }
  // Ordinary memory: the CPU reads its own memory at full speed.
  DeviceMemory allocate_pinned_host(int64_t bytes, std::string_view what) override;
  void copy_from_host(View destination, const void* source) override;
  void copy_to_host(void* destination, View source) override;
  void queue_copy_to_host(void* destination, View source) override;
  // Every op has completed when it returns: nothing to wait for.
  void synchronize() override { refuse_in_capture("synchronize"); }
  DeviceMark mark() override {
    refuse_in_capture("mark");
    return {++marks_};
  }
  void wait_for(DeviceMark /*mark*/) override { refuse_in_capture("wait_for"); }
  void fill_zero(View values) override;
  void copy(View destination, View source) override;
  // Grown when a larger request first comes and kept: a training step's shapes are the first
  // step's, so later steps allocate nothing.
  void* scratch(int64_t bytes, std::string_view op) override;
  // common::Error: the CPU has no CUDA context.
  const CudaContext& cuda_context() override;

  void begin_capture() override;
  std::unique_ptr<DeviceGraph> end_capture() override;
  void abandon_capture() noexcept override { recording_.reset(); }
  bool capturing() const override { return recording_ != nullptr; }
  HostOpRecording* host_recording() override { return recording_.get(); }

 private:
  std::unique_ptr<HostOpRecording> recording_;
  MemoryLedger ledger_;
  std::vector<std::max_align_t> scratch_;
  uint64_t marks_ = 0;
};

}  // namespace backend
