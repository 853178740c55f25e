// The TCP rendezvous: how rank 0's bootstrap blob (NCCL's 128-byte unique id) reaches every
// rank when no MPI is up, over MASTER_ADDR:MASTER_PORT as torchrun sets them (torch's
// env:// init method and its TCPStore play this part there). A bootstrap exchange of one small
// blob over plain POSIX sockets, not a collective transport: the collectives themselves are
// NCCL's or MPI's.
//
// Protocol (version 1; integers big-endian):
//   rank 0 listens on MASTER_PORT on every interface (SO_REUSEADDR) and accepts world_size − 1
//   connections; each peer connects to MASTER_ADDR:MASTER_PORT (names resolved by getaddrinfo,
//   retried until the timeout: rank 0 may start later) and says hello:
//     "MNRV" · u32 version · u64 rank · u64 world_size
//   Once every rank 1 … world_size − 1 has said hello once, rank 0 answers each:
//     u8 status (0: ok, 1: refused) · u64 length · length bytes (the payload, or the reason)
//   A connection that does not start with the magic is someone else's and is closed and
//   ignored; a rank out of range, a rank that arrives twice or another world size is refused:
//   rank 0 sends the reason to every peer that has arrived and fails with it.
// Every wait is bounded by the timeout; a peer's wait for rank 0's answer counts from when it
// connected, so a peer that started before rank 0 still gets rank 0's full timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backend {

struct RendezvousAddress {
  std::string host;  // MASTER_ADDR: a name or a numeric IPv4/IPv6 address
  int port = 0;      // MASTER_PORT: 1 to 65535
};

// A port number from its text (an environment variable's value), else common::Error naming
// `variable`, the text and what is valid (1 to 65535).
int parse_rendezvous_port(std::string_view text, std::string_view variable);

// The largest payload a peer accepts: a stray service that answers with something else must
// not make a peer allocate gigabytes.
inline constexpr uint64_t kMaxRendezvousPayloadBytes = uint64_t{1} << 20;

// Rank 0's payload, on every rank (rank 0 gets its own back). Called once by each of the
// world_size ranks with the same address, world size and timeout; `payload_on_rank0` is read
// on rank 0 only. world_size 1 returns the payload without touching the network.
// common::Error naming the address (host:port, MASTER_ADDR/MASTER_PORT) and the rank when a
// peer cannot reach rank 0 within the timeout, when rank 0 cannot listen on the port, when
// rank 0's timeout passes before every rank has arrived (naming the missing ranks), and when a
// rank is refused.
std::vector<std::byte> rendezvous_broadcast(const RendezvousAddress& address, int64_t rank,
                                            int64_t world_size,
                                            std::span<const std::byte> payload_on_rank0,
                                            std::chrono::milliseconds timeout);

}  // namespace backend
