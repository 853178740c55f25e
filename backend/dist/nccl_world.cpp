// The NCCL world's bootstrap: rank 0's unique id to every rank, over MPI or the TCP rendezvous;
// see nccl_communicator.hpp. Plain C++ (NCCL itself is behind make_nccl_unique_id and
// make_nccl_communicator), built with and without CUDA.
#include <cstring>
#include <limits>

#include "backend/common/error.hpp"
#include "backend/device/cuda_device.hpp"
#include "backend/dist/nccl_communicator.hpp"

namespace backend {
namespace {

// MPI moves typed elements, not bytes: the length as one int32, then the bytes in int32 words
// (the last one padded with zeros). The MPI communicator carries no byte type, and an int32
// broadcast moves the bits unchanged.
std::vector<std::byte> broadcast_over_mpi(Communicator& world, std::span<const std::byte> bytes) {
  int32_t length = 0;
  if (world.rank() == 0) {
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      common::fail("the NCCL bootstrap broadcasts at most 2 GiB, not {} bytes", bytes.size());
    }
    length = static_cast<int32_t>(bytes.size());
  }
  world.broadcast(host_view(std::span(&length, 1)), 0);
  std::vector<int32_t> words((static_cast<size_t>(length) + 3) / 4, 0);
  if (world.rank() == 0 && length > 0) std::memcpy(words.data(), bytes.data(), bytes.size());
  world.broadcast(host_view(std::span(words)), 0);
  std::vector<std::byte> shared(static_cast<size_t>(length));
  if (length > 0) std::memcpy(shared.data(), words.data(), shared.size());
  return shared;
}

}  // namespace

std::vector<std::byte> share_from_rank0(const NcclBootstrap& bootstrap,
                                        std::span<const std::byte> on_rank0) {
  if (bootstrap.world_size < 1 || bootstrap.rank < 0 || bootstrap.rank >= bootstrap.world_size) {
    common::fail(
        "the NCCL bootstrap was given rank {} of {} ranks (valid: 0 to the world size "
        "- 1)",
        bootstrap.rank, bootstrap.world_size);
  }
  if (bootstrap.mpi_world != nullptr) {
    Communicator& world = *bootstrap.mpi_world;
    if (world.rank() != bootstrap.rank || world.size() != bootstrap.world_size) {
      common::fail(
          "the NCCL bootstrap is for rank {} of {}, but MPI's {} group has this "
          "process as rank {} of {}",
          bootstrap.rank, bootstrap.world_size, world.name(), world.rank(), world.size());
    }
    return broadcast_over_mpi(world, on_rank0);
  }
  if (bootstrap.world_size > 1 &&
      (bootstrap.rendezvous.host.empty() || bootstrap.rendezvous.port == 0)) {
    common::fail(
        "rank {} of {} has neither MPI nor a rendezvous address to get NCCL's id from: "
        "launch through MPI, or set MASTER_ADDR (rank 0's host) and MASTER_PORT (a free "
        "port there) as torchrun does (MASTER_ADDR='{}', MASTER_PORT={})",
        bootstrap.rank, bootstrap.world_size, bootstrap.rendezvous.host,
        bootstrap.rendezvous.port == 0 ? std::string("unset")
                                       : std::to_string(bootstrap.rendezvous.port));
  }
  return rendezvous_broadcast(bootstrap.rendezvous, bootstrap.rank, bootstrap.world_size, on_rank0,
                              bootstrap.timeout);
}

std::unique_ptr<Communicator> make_nccl_world(Device& device, const NcclBootstrap& bootstrap) {
  // A device that cannot take part is refused before this rank makes the others wait for it.
  cuda_placement(device);
  NcclUniqueId id{};
  if (bootstrap.rank == 0) id = make_nccl_unique_id();
  const std::vector<std::byte> shared =
      share_from_rank0(bootstrap, bootstrap.rank == 0 ? std::span<const std::byte>(id)
                                                      : std::span<const std::byte>());
  if (shared.size() != id.size()) {
    common::fail("rank {} got {} bytes for NCCL's unique id, which has {}", bootstrap.rank,
                 shared.size(), id.size());
  }
  std::memcpy(id.data(), shared.data(), id.size());
  return make_nccl_communicator(device, id, bootstrap.rank, bootstrap.world_size, "world",
                                bootstrap.timeout);
}

}  // namespace backend
