// pretrain_gpt: Megatron-LM's pretrain_gpt.py entry point, native. Parses Megatron's flags,
// prints the arguments dump, trains, and exits 0; any user error is one clear line and exit
// status 2, never a crash. Started by mpirun/mpiexec (or srun --mpi=pmix) as one of several
// ranks, it joins MPI first and trains as one rank of the data-parallel group; an error on any
// rank then aborts every rank (MPI_Abort), so the job ends instead of waiting in a collective,
// and a rank whose collective waits longer than --distributed-timeout-minutes (another rank
// died or hangs) ends itself, which ends the job (backend/dist/collective_watchdog.hpp).
#include <iostream>
#include <memory>

#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/dist/mpi_session.hpp"
#include "backend/dist/process_environment.hpp"
#include "backend/dist/process_groups.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trainer.hpp"

int main(int argc, char** argv) {
  common::setup_logging("pretrain_gpt");
  std::unique_ptr<backend::MpiSession> mpi;
  // One rank's error ends the job: the others may be waiting in a collective for it.
  const auto abort_job = [&mpi](int status) {
    if (mpi) mpi->abort(status);
    return status;
  };
  return common::run_tool([&] {
    const backend::ProcessEnvironment process = backend::read_process_environment();
    if (backend::started_through_mpi(process)) {
      mpi = backend::start_mpi_session(argc, argv, process);
    }
    // Setup lines once, from rank 0, as Megatron's print_rank_0 (the iteration lines are the
    // last rank's, printed by the trainer); every rank's warnings and errors still show. Also
    // for GPU ranks that meet without MPI, whose groups are made later (trainer.cpp).
    // The flags' warnings are the same on every rank: rank 0 says them once.
    if (process.rank != 0) common::log_errors_only();
    auto arguments = backend::parse_arguments(argc, argv);
    if (process.rank != 0) common::log_warnings_only();
    if (!arguments) return 0;  // --help or --version
    // Until here a collective may wait Megatron's default 10 minutes; from here the flag's.
    if (mpi) mpi->set_timeout_minutes(arguments->parallelism.distributed_timeout_minutes);
    backend::ProcessGroups groups =
        mpi ? backend::make_process_groups(mpi->world(),
                                           backend::parallel_layout(arguments->parallelism))
            : backend::single_process_groups();
    // One write: a log line on stderr cannot cut into it (common::print_lines).
    // The launcher's rank 0 (MPI's too, where MPI is up): GPU ranks meeting without MPI hold
    // one-process groups until the trainer makes theirs.
    if (process.rank == 0) common::print_lines(backend::format_arguments(*arguments));
    backend::pretrain(*arguments, std::cout, {}, groups);
    return 0;
  }, abort_job);
}
