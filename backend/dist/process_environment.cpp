// Rank and world size from the launcher's environment variables; see process_environment.hpp.
#include "backend/dist/process_environment.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/tcp_rendezvous.hpp"

namespace backend {

namespace {

bool read_integer(const char* name, int64_t& value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const long long parsed = std::strtoll(text, &end, 10);
  if (*end != '\0' || parsed < 0) {
    common::fail("environment variable {}='{}' is not a non-negative integer", name, text);
  }
  value = parsed;
  return true;
}

}  // namespace

ProcessEnvironment read_process_environment() {
  ProcessEnvironment environment;
  struct Source {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  // srun sets SLURM_NTASKS for the whole allocation too; SLURM_STEP_ID says we run in a step.
  const bool in_slurm_step = std::getenv("SLURM_STEP_ID") != nullptr;
  for (const Source& source :
       {Source{"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
        Source{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK"},
        Source{"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        Source{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}) {
    if (std::string(source.launcher) == "slurm" && !in_slurm_step) continue;
    int64_t size = 0;
    if (!read_integer(source.size, size)) continue;
    environment.world_size = size;
    read_integer(source.rank, environment.rank);
    // PMI launchers name the local rank differently: MPICH's Hydra MPI_LOCALRANKID, Cray's PALS
    // (mpiexec on PBS systems such as ALCF's) PALS_LOCAL_RANKID, Cray PMI PMI_LOCAL_RANK.
    if (!read_integer(source.local_rank, environment.local_rank) &&
        std::string(source.launcher) == "pmi" &&
        !read_integer("PALS_LOCAL_RANKID", environment.local_rank)) {
      read_integer("PMI_LOCAL_RANK", environment.local_rank);
    }
    environment.launcher = source.launcher;
    break;
  }
  // torchrun's rendezvous address, whichever launcher started this process.
  if (const char* address = std::getenv("MASTER_ADDR")) environment.master_addr = address;
  if (const char* port = std::getenv("MASTER_PORT"); port != nullptr && *port != '\0') {
    environment.master_port = parse_rendezvous_port(port, "environment variable MASTER_PORT");
  }
  if (const char* node = std::getenv("SLURMD_NODENAME")) {
    environment.node = node;
  } else {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) environment.node = host;
  }
  return environment;
}

std::string not_started_through_mpi(const ProcessEnvironment& environment, int64_t ranks) {
  std::string who;
  if (environment.world_size > 1) {
    who = fmt::format("this process is task {} of {} ({} launch, node {}), but it was not started "
                      "through MPI, so it cannot reach the other tasks",
                      environment.rank, environment.world_size, environment.launcher, environment.node);
  } else {
    std::vector<std::string> torchrun;
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"}) {
      if (std::getenv(name) != nullptr) torchrun.emplace_back(name);
    }
    who = torchrun.empty()
              ? std::string("this is one process, started without an MPI launcher")
              : fmt::format(
                    "this is one process: {} {} set, as torchrun sets them, but no MPI "
                    "launcher started it, and CPU ranks do not meet through torchrun's "
                    "variables",
                    fmt::join(torchrun, ", "), torchrun.size() == 1 ? "is" : "are");
  }
  return fmt::format(
      "{}: pretrain_gpt's CPU ranks are started by an MPI launcher; launch with "
      "mpirun/mpiexec (Open MPI: `mpirun -np {} pretrain_gpt <flags>`), or srun "
      "--mpi=pmix where Slurm has PMIx (`srun --mpi=pmix -n {} pretrain_gpt "
      "<flags>`), which pretrain_gpt joins; GPU ranks (--device cuda) also meet "
      "without MPI, over NCCL, through torchrun's RANK, WORLD_SIZE, LOCAL_RANK, "
      "MASTER_ADDR and MASTER_PORT (docs/parallelism.md)",
      who, ranks, ranks);
}

bool started_through_mpi(const ProcessEnvironment& environment) {
  if (environment.world_size <= 1) return false;
  if (environment.launcher == "openmpi" || environment.launcher == "pmi") return true;
  return environment.launcher == "slurm" && std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace backend
