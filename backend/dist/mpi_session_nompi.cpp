// start_mpi_session in a build without MPI: refused with what to do instead.
#include "backend/common/error.hpp"
#include "backend/dist/mpi_session.hpp"

namespace backend {

std::unique_ptr<MpiSession> start_mpi_session(int&, char**&, const ProcessEnvironment&) {
  common::fail("this process was started by an MPI launcher, but pretrain_gpt was built without "
               "MPI (install Open MPI's development files, libopenmpi-dev, and rebuild), so it "
               "cannot talk to the other ranks; launch one process");
}

}  // namespace backend
