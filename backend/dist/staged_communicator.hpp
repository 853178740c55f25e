// Communicators that carry another memory's views: the staged communicator copies each view into
// a staging buffer of the memory its inner communicator reads, runs the inner collective there
// and copies the results back; the routed communicator sends device memory one way and host
// memory another. Together they are what torch.distributed's gloo backend and its pairing of
// NCCL with gloo give Megatron (--distributed-backend, docs/parallelism.md "Collectives and
// memory"):
//   gloo on a GPU: device tensors staged through page-locked host memory over Open MPI, host
//     scalars over Open MPI directly, so several ranks may share one GPU (NCCL refuses that);
//   nccl without MPI: the few host scalars (loss sums, exit decisions) staged through a small
//     device buffer over NCCL.
// On the CPU device, whose memory is host memory, staging is a copy: --distributed-backend gloo
// --device cpu runs every collective through it, which is how CI tests the staging.
//
// A staged call is blocking: it returns once its results are back in the caller's memory, and
// the start_* calls run at once (correct, not overlapped). Staging buffers grow to the largest
// call seen and stay; copies back from page-locked memory are queued on the device's stream, so
// the next call waits for them (Device::synchronize) before writing the staging again.
#pragma once

#include <memory>

#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"

namespace backend {

// The memory the inner communicator reads: host (Open MPI), the callers' views then being the
// device's memory; or the device's (NCCL), the callers' views then being host memory.
enum class StagingMemory { host, device };

// `inner`'s collectives for views in the memory it does not read; split() stages the new group
// alike. `device` copies between the memories and must outlive the communicator. A view in the
// wrong memory is a common::Error naming the call and the group.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner,
                                                       Device& device, StagingMemory inner_reads);

// Each call to `device_path` when its views are GPU memory (MemoryKind::cuda), to `host_path`
// when they are host memory; a barrier to `host_path`. Both are the same members in the same
// rank order (made by the same splits of two worlds of one layout), else common::Error. A call
// whose views are in both memories (an all-gather from host into GPU memory, a batch mixing
// them) is a common::Error naming the call and the group.
std::unique_ptr<Communicator> make_routed_communicator(std::unique_ptr<Communicator> device_path,
                                                       std::unique_ptr<Communicator> host_path);

}  // namespace backend
