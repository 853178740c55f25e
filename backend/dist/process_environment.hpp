// Which task of a multi-process launch this process is, read from the launcher's environment:
// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURMD_NODENAME), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE), PMI (PMI_RANK/PMI_SIZE: MPICH, Cray's mpiexec on PBS) and
// torchrun/Kubeflow (RANK, WORLD_SIZE). pretrain_gpt joins MPI when an MPI launcher started it,
// and the trainer checks that MPI's world is the one the launcher meant, so N tasks never
// train N independent copies. Also recorded: the rank on this node (each launcher's own
// variable, LOCAL_RANK for torchrun: which GPU a rank takes) and torchrun's MASTER_ADDR and
// MASTER_PORT, where the TCP rendezvous meets when no MPI is up (tcp_rendezvous.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace backend {

struct ProcessEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string node;      // host or Slurm node name, for messages
  std::string launcher;  // "slurm", "openmpi", "pmi", "torchrun" or "" for a single process
  // SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID (MPICH's PMI; Cray PALS's
  // PALS_LOCAL_RANKID or PMI_LOCAL_RANK where it is unset) or LOCAL_RANK, by launcher as above;
  // 0 when the launcher did not say.
  int64_t local_rank = 0;
  std::string master_addr;  // MASTER_ADDR, "" when unset
  int master_port = 0;      // MASTER_PORT (1 to 65535), 0 when unset
};

// Reads the environment; malformed values are a common::Error naming the variable (a
// MASTER_PORT that is not a port number too, whether or not anything will use it: a typo is
// found at start, not when the rendezvous is first needed).
ProcessEnvironment read_process_environment();

// Whether MPI can start here: one of several tasks that an MPI launcher started (mpirun or
// mpiexec: Open MPI's or a PMI one) or srun with a PMIx server (--mpi=pmix: PMIX_RANK set).
// srun without it cannot initialise Open MPI (MPI_Init would end the process), nor can
// torchrun-style variables alone: those tasks are refused with how to launch.
bool started_through_mpi(const ProcessEnvironment& environment);

// Why a process that was not started through MPI cannot be one of `ranks` ranks of pretrain_gpt,
// and how to start them: "this process is task 0 of 2 (torchrun launch, node n1), but it was not
// started through MPI, so it cannot reach the other tasks: ... launch with mpirun/mpiexec (Open
// MPI: `mpirun -np 2 pretrain_gpt <flags>`) or ..., GPU ranks also meet without MPI ..."; for a
// lone process, which torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR) it
// has, since those start no MPI. Said to CPU ranks: GPU ranks may meet without MPI
// (device_collectives.hpp, make_groups_without_mpi).
std::string not_started_through_mpi(const ProcessEnvironment& environment, int64_t ranks);

}  // namespace backend
