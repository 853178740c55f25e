// doctest's main for tests/mpi/: every rank of an mpirun runs every test case, in the same
// order (the collectives need all members), against the world communicator the tests get from
// world(). The exit status is the worst of all ranks', so a check failing on one rank fails the
// CTest entry (tests/CMakeLists.txt runs this under mpirun -np 3 --oversubscribe).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <memory>

#include "backend/dist/mpi_session.hpp"
#include "backend/dist/process_environment.hpp"
#include "mpi/mpi_test_world.hpp"

namespace {
backend::Communicator* the_world = nullptr;
}

backend::Communicator& mpi_test::world() { return *the_world; }

int main(int argc, char** argv) {
  auto session = backend::start_mpi_session(argc, argv, backend::read_process_environment());
  auto world = session->world();
  the_world = world.get();
  doctest::Context context(argc, argv);
  // Only rank 0 reports; the others run silently (their failures still count below).
  if (world->rank() != 0) context.setOption("out", "/dev/null");
  int status = context.run();
  world->all_reduce(backend::View{&status, 1, backend::ElementType::i32, backend::MemoryKind::host},
                    backend::ReduceOperation::max);
  the_world = nullptr;
  world.reset();
  return status;
}
