// Which task of a multi-process launch this process is, read from the launcher's environment:
// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURMD_NODENAME), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE), PMI (PMI_RANK/PMI_SIZE: MPICH, Cray's mpiexec on PBS) and
// torchrun/Kubeflow (RANK, WORLD_SIZE). pretrain_gpt joins MPI when an MPI launcher started it,
// and the trainer checks that MPI's world is the one the launcher meant, so N tasks never
// train N independent copies.
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

// Whether MPI can start here: one of several tasks that an MPI launcher started (mpirun or
// mpiexec: Open MPI's or a PMI one) or srun with a PMIx server (--mpi=pmix: PMIX_RANK set).
// srun without it cannot initialise Open MPI (MPI_Init would end the process), nor can
// torchrun-style variables alone: those tasks are refused by the trainer with how to launch.
bool started_through_mpi(const ProcessEnvironment& environment);

}  // namespace backend
