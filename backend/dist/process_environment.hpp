// Which task of a multi-process launch this process is, read from the launcher's environment:
// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURMD_NODENAME), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE), PMI (PMI_RANK/PMI_SIZE: MPICH, Cray's mpiexec on PBS) and
// torchrun/Kubeflow (RANK, WORLD_SIZE). The distributed path will build its process groups
// from this; until then the trainer uses it to refuse a multi-process launch loudly instead of
// training N independent copies.
#pragma once

#include <cstdint>
#include <string>

namespace backend {

struct ProcessEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string node;      // host or Slurm node name, for messages
  std::string launcher;  // "slurm", "openmpi", "pmi", "torchrun" or "" for a single process
};

// Reads the environment; malformed values are a common::Error naming the variable.
ProcessEnvironment read_process_environment();

}  // namespace backend
