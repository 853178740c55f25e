// Device: where the model's memory lives and its ops run, chosen at run time (--device): its
// memory, its copies, the scratch its ops share and, for a GPU, the stream and handles its ops'
// CUDA twins run on (docs/device.md, "The device seam"). The ops themselves are not here: each
// op family (backend/ops/<family>.hpp) takes the Device, checks its views once and calls its
// CPU or CUDA twin (ggml's split: a small device interface, ops dispatched by the op). So the
// model is written once against ops over Views; CpuDevice and the CUDA device differ in memory
// and streams only.
//
// An empty View is an absent tensor. Errors are common::Error.
//
// Nevers kept here: no CUDA header, no global stream or handle (a device owns its own), no
// allocation in an op on a GPU: memory is carved at setup (arena.hpp), scratch reserved when
// the device is made.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/common/enum_names.hpp"
#include "backend/core/view.hpp"
#include "backend/device/cuda_context.hpp"
#include "backend/device/device_memory.hpp"

namespace backend {

// What --device asks for (our flag): the CPU; a GPU, an error where none is visible; or
// automatic, a GPU where one is visible, else the CPU (train/trainer.hpp's select_device).
enum class DeviceChoice { automatic, cpu, cuda };
constexpr common::EnumName<DeviceChoice> kDeviceChoiceNames[] = {
    {DeviceChoice::automatic, "auto"}, {DeviceChoice::cpu, "cpu"}, {DeviceChoice::cuda, "cuda"}};
constexpr std::span<const common::EnumName<DeviceChoice>> enum_names(DeviceChoice) {
  return kDeviceChoiceNames;
}

// Watches a device's ops: op_started before an op's twin runs, op_queued once it has been
// queued (on the CPU: has run), with the op's floating-point operations where the op counts
// them (matrix products and attention; 0 elsewhere). tests/bench/op_profile_bench.cpp times
// each op with it.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void op_started(std::string_view op) = 0;
  virtual void op_queued(std::string_view op, double flops) = 0;
};

// A point in one device's order of work (Device::mark). Value-initialised it is no point:
// waiting for it returns at once.
struct DeviceMark {
  uint64_t sequence = 0;
};

// Work a device captured (Device::begin_capture .. end_capture), queued again by replay() with
// the arguments and the memory it was captured with: a CUDA graph on a GPU (one launch for the
// whole), on the CPU the recorded twin calls run in order. What changes from one replay to the
// next must therefore be in device memory the captured work reads (uploaded before replay),
// never a kernel argument (docs/step_on_device.md, item 5).
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
  virtual int64_t nodes() const = 0;  // the work items captured: kernels, copies, fills
};

// What a host device records while it captures, instead of running it: each op's CPU twin call
// with its arguments as they stood (ops/dispatch.hpp's run copies the call), and the device's
// own copies and fills. The CPU's stand-in for a stream capture, so that CI checks what a graph
// freezes: an argument that should change between replays and does not shows as other bits.
class HostOpRecording {
 public:
  void add(std::function<void()> call) { calls_.push_back(std::move(call)); }
  int64_t calls() const { return std::ssize(calls_); }
  void run() const {
    for (const std::function<void()>& call : calls_) call();
  }

 private:
  std::vector<std::function<void()>> calls_;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual MemoryKind memory_kind() const = 0;

  // Memory: `what` names it in an out-of-memory error. Only arenas call this, at setup.
  virtual DeviceMemory allocate_zeroed(int64_t bytes, std::string_view what) = 0;
  // The bytes of this device's live allocations, now and at most so far (Megatron's memory
  // line; there is no caching allocator, so what is reserved is what is allocated).
  virtual MemoryUsage memory_usage() const = 0;
  // Host memory this device copies to and from without an intermediate copy (a GPU's
  // page-locked memory; ordinary memory on the CPU): the staging of collectives whose library
  // reads another memory than the device's (backend/dist/staged_communicator.hpp). Host memory,
  // so not in memory_usage(). May be called after setup (a staging buffer grows).
  virtual DeviceMemory allocate_pinned_host(int64_t bytes, std::string_view what) = 0;
  // From host memory; the call returns once `source` may be reused, except from
  // allocate_pinned_host's memory, which the device may still be reading until synchronize(),
  // or until wait_for a mark() made after the copy.
  virtual void copy_from_host(View destination, const void* source) = 0;  // destination.bytes()
  // Waits for the device's queued work, then copies: `destination` holds the bytes on return.
  virtual void copy_to_host(void* destination, View source) = 0;  // source.bytes()
  // Queues the copy in the device's order of work, without waiting: `destination`, memory of
  // allocate_pinned_host, holds the bytes once wait_for a mark() made after this call returns
  // (on the CPU, on return). How the host reads a result while the device goes on.
  virtual void queue_copy_to_host(void* destination, View source) = 0;  // source.bytes()
  // The host waits until the work queued so far on this device has completed (nothing to wait
  // for on the CPU): before host memory a queued copy reads is written again.
  virtual void synchronize() = 0;
  // mark() names the point after the work queued so far; wait_for(mark) holds the host until
  // the work up to that point has completed, not what was queued after it (on a GPU: an event
  // recorded on the stream). What a page-locked upload slot needs before the host writes it
  // again (pinned_upload_ring.hpp), without draining the device. A mark of another device is
  // not checked: it may wait for the wrong point. On the CPU every op has completed when it
  // returns: marks are counted, waits return at once.
  virtual DeviceMark mark() = 0;
  virtual void wait_for(DeviceMark mark) = 0;
  virtual void fill_zero(View values) = 0;
  // destination = source, both this device's memory, of one element type and element count
  // (else common::Error naming both); they may be the same view, not otherwise overlap. In the
  // device's order of work, as its ops (a pipeline stage keeps what it received or sends a copy).
  virtual void copy(View destination, View source) = 0;
  // Memory an op may use during one call (per-thread blocks of the CPU's attention, the CUDA
  // norms' partial column sums, the CUDA reductions' partial sums): `bytes` of this device's
  // memory, aligned for any element type, contents free on entry and on exit. Ops run one at a
  // time on a device, so they share it. The CPU device grows it when a larger shape first
  // runs and keeps it; a CUDA device reserved it when it was made and refuses a larger request
  // naming `op` and the sizes (common::Error).
  virtual void* scratch(int64_t bytes, std::string_view op) = 0;
  // For an op's CUDA twin: the device's GPU made current on the calling thread (a process may
  // drive several GPUs from one thread), its stream and handles. common::Error naming the
  // device for one without CUDA.
  virtual const CudaContext& cuda_context() = 0;

  // Capture (a CUDA stream capture; on the CPU a HostOpRecording): from begin_capture to
  // end_capture the ops, copy and fill_zero are recorded, not run; end_capture returns them as
  // a graph that replay() queues. Inside a capture the host may neither read nor write the
  // device's memory nor wait for it, nor allocate: copy_from_host, copy_to_host,
  // queue_copy_to_host, synchronize, mark, wait_for, allocate_zeroed and allocate_pinned_host
  // fail naming the call (a GPU capture would be invalidated, or would freeze a host address).
  // A failed capture (an op refused, the driver invalidated it) leaves the device not
  // capturing, its recorded work dropped: the caller runs the work eagerly instead.
  // The default: this device cannot capture (common::Error naming it).
  virtual void begin_capture();
  virtual std::unique_ptr<DeviceGraph> end_capture();
  // Ends a capture that went wrong, dropping what was recorded; nothing when not capturing.
  virtual void abandon_capture() noexcept {}
  virtual bool capturing() const { return false; }
  // The host device's recording while it captures, else nullptr (ops/dispatch.hpp).
  virtual HostOpRecording* host_recording() { return nullptr; }

  // Whoever watches this device's ops (a profiler), or nullptr: each op of backend/ops/ calls
  // it before and after its twin runs. Not owned.
  OpObserver* observer() const { return observer_; }
  void set_observer(OpObserver* observer) { observer_ = observer; }

 protected:
  // common::Error naming `call` while capturing(): what a capture cannot hold (begin_capture).
  void refuse_in_capture(std::string_view call) const;

 private:
  OpObserver* observer_ = nullptr;
};

}  // namespace backend
