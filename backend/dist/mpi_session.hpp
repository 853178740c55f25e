// The MPI library for the life of a process: MPI_Init_thread when made, MPI_Finalize when
// destroyed, and the world communicator over Open MPI (Communicator, communicator.hpp) for
// CPU ranks. Made once, in main, when the launcher was mpirun/mpiexec (or srun with PMI), and
// passed down: nothing else initialises MPI. mpi_session_mpi.cpp in a build with MPI,
// mpi_session_nompi.cpp (a refusal naming what to do) without.
#pragma once

#include <memory>

#include "backend/dist/communicator.hpp"

namespace backend {

class MpiSession {
 public:
  virtual ~MpiSession() = default;
  // MPI_COMM_WORLD as a Communicator named "world".
  virtual std::unique_ptr<Communicator> world() = 0;
  // MPI_Abort of every rank: one rank's error ends the job at once instead of leaving the
  // others waiting in a collective until the scheduler's wall time.
  [[noreturn]] virtual void abort(int status) = 0;
};

// common::Error when the build has no MPI or MPI cannot start.
std::unique_ptr<MpiSession> start_mpi_session(int& argc, char**& argv);

}  // namespace backend
