// The world communicator of a tests/mpi/ run (mpi_test_main.cpp makes it).
#pragma once

#include "backend/dist/communicator.hpp"

namespace mpi_test {
backend::Communicator& world();
}
