// The NCCL world's bootstrap without a GPU (backend/dist/nccl_communicator.hpp): rank 0's bytes
// reach every rank through an MPI world (here the one-process communicator standing in) or the
// TCP rendezvous (ranks as threads on 127.0.0.1); the refusals name what is missing: an MPI
// world of another size, no rendezvous address, a device that is not a GPU. NCCL's own calls
// on a GPU are tests/gpu/nccl_communicator_test.cpp; over three MPI ranks,
// tests/mpi/nccl_bootstrap_test.cpp.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/device/cpu_device.hpp"
#include "backend/dist/nccl_communicator.hpp"
#include "free_port.hpp"

using backend::NcclBootstrap;
using namespace std::chrono_literals;

namespace {

using test_support::free_port;

std::vector<std::byte> id_like(size_t count) {
  std::vector<std::byte> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<std::byte>(255 - i % 251);
  return bytes;
}

}  // namespace

TEST_CASE("NCCL communicator bootstrap: rank 0's bytes reach every rank over MPI's broadcast") {
  auto world = backend::make_single_process_communicator("world");
  for (const size_t count : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{130}}) {
    const std::vector<std::byte> bytes = id_like(count);
    NcclBootstrap bootstrap;
    bootstrap.mpi_world = world.get();
    INFO(count << " bytes");
    CHECK(backend::share_from_rank0(bootstrap, bytes) == bytes);
  }
}

TEST_CASE("NCCL communicator bootstrap: rank 0's bytes reach every rank over the rendezvous") {
  const int port = free_port();
  const std::vector<std::byte> id = id_like(backend::kNcclUniqueIdBytes);
  std::vector<std::vector<std::byte>> shared(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int64_t rank = 0; rank < 3; ++rank) {
    ranks.emplace_back([&, rank] {
      NcclBootstrap bootstrap{.rank = rank,
                              .world_size = 3,
                              .mpi_world = nullptr,
                              .rendezvous = {"127.0.0.1", port},
                              .timeout = 20s};
      try {
        shared[static_cast<size_t>(rank)] = backend::share_from_rank0(
            bootstrap, rank == 0 ? std::span<const std::byte>(id) : std::span<const std::byte>());
      } catch (const common::Error& error) {
        errors[static_cast<size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (size_t rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK(errors[rank].empty());
    CHECK(shared[rank] == id);
  }
}

TEST_CASE("NCCL communicator bootstrap: an MPI world of another size, no rendezvous address") {
  auto world = backend::make_single_process_communicator("world");
  NcclBootstrap bootstrap;
  bootstrap.rank = 1;
  bootstrap.world_size = 2;
  bootstrap.mpi_world = world.get();
  CHECK_THROWS_WITH_AS(backend::share_from_rank0(bootstrap, {}),
                       "the NCCL bootstrap is for rank 1 of 2, but MPI's world group has this "
                       "process as rank 0 of 1",
                       common::Error);
  bootstrap.mpi_world = nullptr;
  CHECK_THROWS_WITH_AS(backend::share_from_rank0(bootstrap, {}),
                       doctest::Contains("rank 1 of 2 has neither MPI nor a rendezvous address "
                                         "to get NCCL's id from: launch through MPI, or set "
                                         "MASTER_ADDR"),
                       common::Error);
  bootstrap.rank = 2;
  CHECK_THROWS_WITH_AS(backend::share_from_rank0(bootstrap, {}),
                       doctest::Contains("rank 2 of 2 ranks"), common::Error);
  // One rank needs neither.
  const std::vector<std::byte> id = id_like(8);
  CHECK(backend::share_from_rank0(NcclBootstrap{}, id) == id);
}

TEST_CASE("an NCCL communicator needs a CUDA device, and its ids come from NCCL") {
  backend::CpuDevice cpu;
  CHECK_THROWS_WITH_AS(backend::make_nccl_world(cpu, NcclBootstrap{}),
                       doctest::Contains("cpu is not a CUDA device"), common::Error);
  CHECK_THROWS_WITH_AS(backend::make_nccl_communicator(cpu, backend::NcclUniqueId{}, 0, 1, "world"),
                       doctest::Contains("not a CUDA device"), common::Error);
  // With NCCL in the build, rank 0's id needs no GPU (NCCL's bootstrap listens on a socket);
  // without, the refusal says what the build lacks. A machine where NCCL finds no network
  // interface fails with NCCL's reason.
  try {
    const backend::NcclUniqueId id = backend::make_nccl_unique_id();
    CHECK(std::any_of(id.begin(), id.end(), [](std::byte b) { return b != std::byte{0}; }));
  } catch (const common::Error& error) {
    const std::string message = error.what();
    MESSAGE("make_nccl_unique_id: " << message);
    CHECK((message.find("built without CUDA/NCCL") != std::string::npos ||
           message.find("ncclGetUniqueId failed") != std::string::npos));
  }
}
