// The MPI library for the life of a process: MPI_Init_thread when made, MPI_Finalize when
// destroyed, and the world communicator over Open MPI (Communicator, communicator.hpp) for
// CPU ranks. Made once, in main, when the launcher was mpirun/mpiexec (or srun with PMI), and
// passed down: nothing else initialises MPI. mpi_session_mpi.cpp in a build with MPI,
// mpi_session_nompi.cpp (a refusal naming what to do) without.
//
// The session owns the collective watchdog (collective_watchdog.hpp): every blocking call of its
// communicators, MPI_Init_thread and MPI_Finalize included, ends the process when it has waited
// longer than --distributed-timeout-minutes (10 until set_timeout_minutes is called with the
// flag's value), so a rank that died or hangs ends the job instead of leaving the others waiting
// until the scheduler's wall time.
#pragma once

#include <memory>

#include "backend/dist/communicator.hpp"
#include "backend/dist/process_environment.hpp"

namespace backend {

class MpiSession {
 public:
  virtual ~MpiSession() = default;
  // MPI_COMM_WORLD as a Communicator named "world".
  virtual std::unique_ptr<Communicator> world() = 0;
  // MPI_Abort of every rank: one rank's error ends the job at once instead of leaving the
  // others waiting in a collective until the scheduler's wall time.
  [[noreturn]] virtual void abort(int status) = 0;
  // --distributed-timeout-minutes: how long one blocking call may wait before this rank ends
  // the job (> 0, else common::Error).
  virtual void set_timeout_minutes(double minutes) = 0;
};

// common::Error when the build has no MPI or MPI cannot start. `process` names this rank and
// its host in the watchdog's message.
std::unique_ptr<MpiSession> start_mpi_session(int& argc, char**& argv,
                                              const ProcessEnvironment& process);

}  // namespace backend
