// CpuDevice: the Device whose memory is the process's own, on which the ops run their CPU twins
// (backend/ops/*_cpu.cpp) in fp32 or fp64: the reference every other device is checked
// against. Memory is anonymous pages the kernel zeroes on first touch
// (common/lazy_zero_allocator.hpp explains why that matters for the parameters).
#pragma once

#include <cstddef>
#include <cstdint>
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
  void queue_copy_to_host(void* destination, View source) override {
    copy_to_host(destination, source);
  }
  void synchronize() override {}  // every op has completed when it returns
  DeviceMark mark() override { return {++marks_}; }
  void wait_for(DeviceMark /*mark*/) override {}
  void fill_zero(View values) override;
  void copy(View destination, View source) override;
  // Grown when a larger request first comes and kept: a training step's shapes are the first
  // step's, so later steps allocate nothing.
  void* scratch(int64_t bytes, std::string_view op) override;
  // common::Error: the CPU has no CUDA context.
  const CudaContext& cuda_context() override;

 private:
  MemoryLedger ledger_;
  std::vector<std::max_align_t> scratch_;
  uint64_t marks_ = 0;
};

}  // namespace backend
