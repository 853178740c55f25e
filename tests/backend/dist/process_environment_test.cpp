// Rank and world size from the launchers' environment variables (with the local rank and
// torchrun's MASTER_ADDR/MASTER_PORT), and the trainer's refusal of a multi-process launch
// until the distributed path exists.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/train/trainer.hpp"

using namespace backend;

namespace {
// Sets variables for one test and restores the previous environment afterwards.
struct ScopedEnvironment {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit ScopedEnvironment(std::vector<std::pair<std::string, std::string>> values) {
    for (const char* name :
         {"SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "SLURMD_NODENAME",
          "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK",
          "MASTER_ADDR", "MASTER_PORT", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"}) {
      const char* old = std::getenv(name);
      saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      unsetenv(name);
    }
    for (const auto& [name, value] : values) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
};
}  // namespace

TEST_CASE("a plain process is task 0 of 1") {
  ScopedEnvironment environment({});
  const auto process = read_process_environment();
  CHECK(process.world_size == 1);
  CHECK(process.rank == 0);
  CHECK(process.launcher.empty());
}

TEST_CASE("srun, mpirun, PMI and torchrun tasks are recognised") {
  {
    ScopedEnvironment environment({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"},
                                   {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURMD_NODENAME", "node2"}});
    const auto process = read_process_environment();
    CHECK(process.world_size == 2);
    CHECK(process.rank == 1);
    CHECK(process.launcher == "slurm");
    CHECK(process.node == "node2");
  }
  {
    // In a batch script but outside srun, the allocation's variables are not this process's.
    ScopedEnvironment environment({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "16"}});
    CHECK(read_process_environment().world_size == 1);
  }
  {
    ScopedEnvironment environment({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK(read_process_environment().launcher == "openmpi");
    CHECK(read_process_environment().rank == 3);
  }
  {
    ScopedEnvironment environment({{"PMI_RANK", "0"}, {"PMI_SIZE", "8"}});
    CHECK(read_process_environment().launcher == "pmi");
  }
  {
    ScopedEnvironment environment({{"RANK", "0"}, {"WORLD_SIZE", "x"}});
    CHECK_THROWS_WITH_AS(read_process_environment(),
                         doctest::Contains("WORLD_SIZE='x' is not a non-negative integer"),
                         common::Error);
  }
}

TEST_CASE("the local rank, MASTER_ADDR and MASTER_PORT (the rendezvous's) are recorded") {
  {
    ScopedEnvironment environment({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                   {"MASTER_ADDR", "node0.cluster"}, {"MASTER_PORT", "29500"}});
    const auto process = read_process_environment();
    CHECK(process.launcher == "torchrun");
    CHECK(process.rank == 5);
    CHECK(process.local_rank == 1);
    CHECK(process.master_addr == "node0.cluster");
    CHECK(process.master_port == 29500);
    // torchrun's variables alone still cannot start MPI: the trainer refuses as before.
    CHECK_FALSE(started_through_mpi(process));
  }
  {
    ScopedEnvironment environment({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"LOCAL_RANK", "7"}});
    const auto process = read_process_environment();
    CHECK(process.local_rank == 3);  // the launcher's own variable
    CHECK(process.master_addr.empty());
    CHECK(process.master_port == 0);
  }
  {
    // Cray's PALS mpiexec (PBS systems such as ALCF's) names the local rank its own way; MPICH's
    // Hydra variable wins where both are set.
    ScopedEnvironment environment({{"PMI_RANK", "6"},
                                   {"PMI_SIZE", "8"},
                                   {"PALS_LOCAL_RANKID", "2"},
                                   {"PMI_LOCAL_RANK", "5"}});
    CHECK(read_process_environment().local_rank == 2);
  }
  {
    ScopedEnvironment environment({{"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"PMI_LOCAL_RANK", "3"}});
    CHECK(read_process_environment().local_rank == 3);
  }
  {
    ScopedEnvironment environment({{"PMI_RANK", "6"},
                                   {"PMI_SIZE", "8"},
                                   {"MPI_LOCALRANKID", "1"},
                                   {"PALS_LOCAL_RANKID", "2"}});
    CHECK(read_process_environment().local_rank == 1);
  }
  {
    ScopedEnvironment environment({});
    CHECK(read_process_environment().local_rank == 0);
  }
  for (const char* port : {"http", "0", "65536", "29500 "}) {
    ScopedEnvironment environment({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", port}});
    CHECK_THROWS_WITH_AS(read_process_environment(),
                         ("environment variable MASTER_PORT='" + std::string(port) +
                          "' is not a port number (valid: 1 to 65535)")
                             .c_str(),
                         common::Error);
  }
  {
    ScopedEnvironment environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}});
    CHECK_THROWS_WITH_AS(read_process_environment(),
                         doctest::Contains("LOCAL_RANK='x' is not a non-negative integer"),
                         common::Error);
  }
}

TEST_CASE("the trainer refuses to be one of several processes, naming its task and node") {
  ScopedEnvironment environment({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  TrainingArguments a;
  a.model.num_layers = 1;
  a.model.hidden_size = 16;
  a.model.num_attention_heads = 2;
  a.model.seq_length = 8;
  a.run.micro_batch_size = 1;
  a.run.train_iters = 1;
  a.optimizer.lr = 1e-3;
  a.tokenizer.vocab_size = 63;
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.data.mock_data = true;
  a.evaluation.eval_iters = 0;
  validate_arguments(a);
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(pretrain(a, log),
                       doctest::Contains("this process is task 1 of 2 (openmpi launch"),
                       common::Error);
}
