// --distributed-backend applied to a rank's groups; see device_collectives.hpp.
#include "backend/dist/device_collectives.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <utility>

#include "backend/common/error.hpp"
#include "backend/dist/nccl_communicator.hpp"
#include "backend/dist/staged_communicator.hpp"

namespace backend {
namespace {

std::chrono::milliseconds timeout_of(double minutes) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double, std::ratio<60>>(minutes));
}

// Every group of `groups` (Open MPI's) paired with the same group of an NCCL world: the NCCL
// id travels in Open MPI's broadcast, and make_process_groups splits the NCCL world in the
// order it split MPI's, so each pair is the same members in the same rank order.
void route_over_nccl(ProcessGroups& groups, Device& device, double timeout_minutes) {
  const std::chrono::milliseconds timeout = timeout_of(timeout_minutes);
  std::unique_ptr<Communicator> nccl_world;
  try {
    nccl_world = make_nccl_world(device, {.rank = groups.rank,
                                          .world_size = groups.world->size(),
                                          .mpi_world = groups.world.get(),
                                          .rendezvous = {},
                                          .timeout = timeout});
  } catch (const common::Error& error) {
    common::fail(
        "--distributed-backend nccl: {}; --distributed-backend gloo runs these ranks' "
        "collectives over Open MPI through host memory instead",
        error.what());
  }
  ProcessGroups nccl = make_process_groups(std::move(nccl_world), groups.layout);
  const auto open_mpi = groups.communicators();
  const auto over_nccl = nccl.communicators();
  for (size_t i = 0; i < open_mpi.size(); ++i) {
    *open_mpi[i] = make_routed_communicator(std::move(*over_nccl[i]), std::move(*open_mpi[i]));
  }
  if (groups.is_first_rank()) {
    spdlog::info(
        "--distributed-backend nccl: the GPU tensors' collectives over NCCL, host "
        "values over Open MPI");
  }
}

// `group` and a duplicate of it (a split of one color: the same members) as one routed
// communicator, the duplicate staged through `staging` memory: through host memory it carries
// the GPU tensors (over Open MPI), through device memory the host values (over NCCL).
std::unique_ptr<Communicator> route_with_staged_duplicate(std::unique_ptr<Communicator> group,
                                                          Device& device, StagingMemory staging) {
  std::unique_ptr<Communicator> staged =
      make_staged_communicator(group->split(0, group->rank(), group->name()), device, staging);
  return staging == StagingMemory::host
             ? make_routed_communicator(std::move(staged), std::move(group))
             : make_routed_communicator(std::move(group), std::move(staged));
}

}  // namespace

void route_collectives(ProcessGroups& groups, Device& device,
                       const ParallelismArguments& parallelism) {
  const int64_t ranks = groups.world->size();
  if (ranks == 1 || groups.routed) return;
  groups.routed = true;
  const bool on_gpu = device.memory_kind() == MemoryKind::cuda;
  if (parallelism.distributed_backend == DistributedBackend::nccl) {
    if (on_gpu) route_over_nccl(groups, device, parallelism.distributed_timeout_minutes);
    return;  // on the CPU Open MPI carries the collectives, whichever is named
  }
  for (std::unique_ptr<Communicator>* group : groups.communicators()) {
    // On the CPU every call is staged; on a GPU the tensors are, host values go directly.
    *group = on_gpu ? route_with_staged_duplicate(std::move(*group), device, StagingMemory::host)
                    : make_staged_communicator(std::move(*group), device, StagingMemory::host);
  }
  if (groups.is_first_rank()) {
    spdlog::info("--distributed-backend gloo: {}",
                 on_gpu ? "the GPU tensors' collectives over Open MPI through page-locked host "
                          "memory, host values over Open MPI directly"
                        : "every collective over Open MPI through a host staging buffer (a copy "
                          "on the CPU, as a GPU rank's tensors take)");
  }
}

ProcessGroups make_groups_without_mpi(Device& device, const ProcessEnvironment& process,
                                      const ParallelLayout& layout,
                                      const ParallelismArguments& parallelism) {
  if (parallelism.distributed_backend == DistributedBackend::gloo) {
    common::fail(
        "--distributed-backend gloo runs the collectives over Open MPI, and this task "
        "({} launch) was not started through MPI: {}",
        process.launcher, not_started_through_mpi(process, process.world_size));
  }
  std::unique_ptr<Communicator> nccl_world;
  try {
    nccl_world = make_nccl_world(
        device, {.rank = process.rank,
                 .world_size = process.world_size,
                 .mpi_world = nullptr,
                 .rendezvous = {.host = process.master_addr, .port = process.master_port},
                 .timeout = timeout_of(parallelism.distributed_timeout_minutes)});
  } catch (const common::Error& error) {
    common::fail("GPU rank {} of {} ({} launch, without MPI): {}", process.rank, process.world_size,
                 process.launcher, error.what());
  }
  ProcessGroups groups = make_process_groups(std::move(nccl_world), layout);
  for (std::unique_ptr<Communicator>* group : groups.communicators()) {
    *group = route_with_staged_duplicate(std::move(*group), device, StagingMemory::device);
  }
  groups.routed = true;
  if (groups.is_first_rank()) {
    spdlog::info(
        "{} GPU ranks met at {}:{} without MPI: collectives over NCCL, host values "
        "through a device buffer over NCCL",
        process.world_size, process.master_addr, process.master_port);
  }
  return groups;
}

}  // namespace backend
