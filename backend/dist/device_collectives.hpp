// Which library carries a rank's collectives on its device: Megatron's --distributed-backend
// (torch.distributed's nccl or gloo) applied to the process groups once the device is known.
// docs/parallelism.md, "Collectives and memory", has the table; in short, with several ranks:
//   CPU device, nccl (recorded, as before): Open MPI reads the device's memory directly;
//   CPU device, gloo: every collective staged through a host buffer over Open MPI (a copy on
//     the CPU; the path CI runs under mpirun to test the staging a GPU rank uses);
//   GPU device, gloo: device tensors staged through page-locked host memory over Open MPI,
//     host scalars over Open MPI directly; ranks may share a GPU;
//   GPU device, nccl: device tensors over NCCL communicators made by the same splits of an NCCL
//     world (its id shared over Open MPI), host values over Open MPI. Not yet run on several
//     GPUs (docs/parallelism.md).
#pragma once

#include "backend/device/device.hpp"
#include "backend/dist/parallelism_arguments.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/dist/process_groups.hpp"

namespace backend {

// Replaces each of `groups`' communicators (made over Open MPI by make_process_groups) by the
// route above for `parallelism.distributed_backend`; called by every rank, in the same order,
// after the device is chosen. A one-rank world keeps its one-process groups. NCCL's calls wait
// at most --distributed-timeout-minutes. common::Error when NCCL cannot start (the build has
// none, a rank's GPU is refused), naming what runs instead.
void route_collectives(ProcessGroups& groups, Device& device,
                       const ParallelismArguments& parallelism);

// The groups of a GPU rank started without MPI (torchrun's variables, or srun without PMIx,
// with MASTER_ADDR and MASTER_PORT set; ProcessEnvironment): an NCCL world whose id travels
// through the TCP rendezvous (tcp_rendezvous.hpp), split by `layout` (of
// parallelism.world_size == process.world_size ranks), each group's host values staged through
// a device buffer over a duplicate of it (no Open MPI to carry them). Called by every rank.
// common::Error with --distributed-backend gloo (Open MPI's) or when NCCL or the rendezvous
// fails, naming the launch that works.
ProcessGroups make_groups_without_mpi(Device& device, const ProcessEnvironment& process,
                                      const ParallelLayout& layout,
                                      const ParallelismArguments& parallelism);

}  // namespace backend
