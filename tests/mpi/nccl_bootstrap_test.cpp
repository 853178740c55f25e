// The NCCL world's bootstrap over MPI on real ranks (mpirun -np 3): rank 0's bytes (an NCCL id's
// 128, and lengths that are no whole number of the int32 words MPI moves them in) reach every
// rank through the world's broadcast, and a bootstrap whose rank or size is not MPI's is
// refused on every rank (backend/dist/nccl_communicator.hpp; no GPU involved).
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/dist/nccl_communicator.hpp"
#include "mpi/mpi_test_world.hpp"

namespace {

std::vector<std::byte> rank0_bytes(size_t count) {
  std::vector<std::byte> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<std::byte>((i * 37 + 11) & 0xFF);
  return bytes;
}

}  // namespace

TEST_CASE("rank 0's bytes reach every rank through MPI's broadcast") {
  auto& world = mpi_test::world();
  backend::NcclBootstrap bootstrap;
  bootstrap.rank = world.rank();
  bootstrap.world_size = world.size();
  bootstrap.mpi_world = &world;
  for (const size_t count : {backend::kNcclUniqueIdBytes, size_t{0}, size_t{5}, size_t{1001}}) {
    const std::vector<std::byte> expected = rank0_bytes(count);
    // Only rank 0's bytes count: the others pass nothing, or something else.
    const std::vector<std::byte> mine =
        world.rank() == 0 ? expected : std::vector<std::byte>(3, std::byte{0x55});
    INFO(count << " bytes on rank " << world.rank());
    CHECK(backend::share_from_rank0(bootstrap, mine) == expected);
  }
}

TEST_CASE("a bootstrap that is not MPI's rank and size is refused before any broadcast") {
  auto& world = mpi_test::world();
  backend::NcclBootstrap bootstrap;
  bootstrap.rank = world.rank();
  bootstrap.world_size = world.size() + 1;
  bootstrap.mpi_world = &world;
  CHECK_THROWS_WITH_AS(backend::share_from_rank0(bootstrap, {}),
                       doctest::Contains("but MPI's world group has this process as rank"),
                       common::Error);
}
