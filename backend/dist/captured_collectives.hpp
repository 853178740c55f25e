// A communicator whose collectives keep a device's order of work while that device captures
// (Device::begin_capture): what a captured training step calls its data-parallel group
// through (docs/step_on_device.md, item 5). On a GPU a stream capture holds what a
// communicator queues on the device's streams without the host waiting (NCCL's calls:
// Communicator::queued_on_device), so each call passes through. On the CPU device, whose
// capture is a recording of the ops' calls (HostOpRecording), a collective that ran at once
// would read values the recorded ops have not computed yet: each call is recorded with its
// arguments instead, in its place among the ops, and runs when the recording replays (which is
// how CI checks a captured multi-rank step: the bits of the eager one). Outside a capture every
// call passes through.
//
// What a capture cannot hold is refused while capturing, naming the call: a barrier (the host
// waits) and split(). On the CPU device a started call is recorded as the inner
// communicator's own started call in its place and its wait where the caller waits (the
// non-blocking collective, whose summation order may differ from its blocking one's), so a
// replay overlaps and waits where the eager step does: a pipeline's overlapped transfers post
// ahead of the computes between, as the schedule says.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"

namespace backend {

// `inner`'s collectives in `device`'s order of work, as above; both must outlive the result.
std::unique_ptr<Communicator> make_captured_collectives(Communicator& inner, Device& device);

// Whether `group` is one that make_captured_collectives made (its calls keep a capture's order).
bool keeps_capture_order(const Communicator& group);

// Why a capture on `device` cannot hold `group`'s collectives on device memory, or nothing:
// on the CPU device they are recorded (above); on a GPU they must be queued on its streams
// (NCCL), not staged through host memory by the host (--distributed-backend gloo, MPI).
std::optional<std::string> collectives_capture_refusal(const Communicator& group,
                                                       const Device& device);

}  // namespace backend
