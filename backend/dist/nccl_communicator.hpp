// The NCCL communicator: Communicator (communicator.hpp) for GPU ranks, over NVIDIA's NCCL
// (ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast, ncclSend/ncclRecv,
// ncclCommSplit), as torch.distributed's NCCL backend serves Megatron's GPU ranks. Views are
// GPU memory of one CUDA device (make_cuda_device); every call is enqueued on a stream of its own
// after the device's ops so far, and the device's later ops are ordered after it by an event:
// the host does not wait (barrier() excepted), and reads the values through the device's copies.
// A watchdog thread ends the rank when a queued collective fails or outlives the timeout.
// nccl_communicator_cuda.cu in a build with CUDA and NCCL (≥ 2.18, for ncclCommSplit),
// nccl_communicator_nocuda.cpp (refusals) otherwise; this header has no CUDA or NCCL header.
//
// Making the world's: rank 0 asks NCCL for a unique id (ncclGetUniqueId, 128 bytes); every rank
// needs it before ncclCommInitRank. It travels in an MPI broadcast when MPI is up, else through
// the TCP rendezvous on MASTER_ADDR:MASTER_PORT (tcp_rendezvous.hpp), as torchrun's env://.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/device/device.hpp"
#include "backend/dist/communicator.hpp"
#include "backend/dist/tcp_rendezvous.hpp"

namespace backend {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES; the .cu file checks that they agree).
inline constexpr size_t kNcclUniqueIdBytes = 128;
using NcclUniqueId = std::array<std::byte, kNcclUniqueIdBytes>;

// How long one NCCL collective may stay outstanding before the watchdog ends this rank (a
// barrier: before the communicator is aborted and the call fails): NCCL's collectives otherwise
// wait forever for a rank that died. Megatron's --distributed-timeout-minutes default.
inline constexpr std::chrono::minutes kDefaultNcclTimeout{10};

// A new id for a new NCCL communicator (ncclGetUniqueId; called on one rank, which then shares
// it). common::Error when NCCL fails or the build has none.
NcclUniqueId make_nccl_unique_id();

// The communicator of `world_size` ranks that share `id`, this one being `rank`, on `device`'s
// GPU and stream (ncclCommInitRank; every rank calls it). `name` names the group in messages.
// common::Error when the device is not a CUDA device, the rank is out of range, NCCL fails, or
// the build has no CUDA or NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(
    Device& device, const NcclUniqueId& id, int64_t rank, int64_t world_size, std::string name,
    std::chrono::milliseconds timeout = kDefaultNcclTimeout);

// How the world's ranks meet to share rank 0's id.
struct NcclBootstrap {
  int64_t rank = 0;
  int64_t world_size = 1;
  // MPI's world when MPI is up: the id travels in its broadcast (host memory; its rank and size
  // must be rank and world_size). nullptr: the TCP rendezvous at `rendezvous`.
  Communicator* mpi_world = nullptr;
  RendezvousAddress rendezvous;                             // MASTER_ADDR, MASTER_PORT
  std::chrono::milliseconds timeout = kDefaultNcclTimeout;  // the rendezvous's and NCCL's
};

// Rank 0's bytes on every rank, by the bootstrap's route (rank 0 gets its own back): how the
// NCCL id travels, apart from NCCL so that it is tested without a GPU. common::Error when the
// MPI world is not the bootstrap's rank and size, the rendezvous fails (tcp_rendezvous.hpp), or
// the MPI world is absent and MASTER_ADDR or MASTER_PORT unset with more than one rank.
std::vector<std::byte> share_from_rank0(const NcclBootstrap& bootstrap,
                                        std::span<const std::byte> on_rank0);

// The world's NCCL communicator, named "world": rank 0 makes the id, share_from_rank0 carries
// it, every rank joins (make_nccl_communicator). Called by every rank.
std::unique_ptr<Communicator> make_nccl_world(Device& device, const NcclBootstrap& bootstrap);

}  // namespace backend
