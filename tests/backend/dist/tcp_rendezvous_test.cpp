// The TCP rendezvous (backend/dist/tcp_rendezvous.hpp) over real sockets on 127.0.0.1, ranks as
// threads of this process: every rank gets rank 0's payload (peers started before rank 0, a
// stray connection ignored); a peer with no listener fails within its timeout naming host:port;
// rank 0 times out naming the missing ranks and tells those that came; a rank that arrives
// twice is refused; a port already taken and a bad port text are errors naming the port.
#include "backend/dist/tcp_rendezvous.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/common/error.hpp"
#include "free_port.hpp"

using backend::rendezvous_broadcast;
using backend::RendezvousAddress;
using namespace std::chrono_literals;

namespace {

using test_support::free_port;

// A socket bound to 127.0.0.1 on a port the system picked: the port is free while it is held.
struct BoundSocket {
  int fd = -1;
  int port = 0;
  BoundSocket() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
  ~BoundSocket() {
    if (fd >= 0) ::close(fd);
  }
  BoundSocket(const BoundSocket&) = delete;
  BoundSocket& operator=(const BoundSocket&) = delete;
};

std::vector<std::byte> bytes_of(size_t count, unsigned seed) {
  std::vector<std::byte> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return bytes;
}

// One rank's outcome: its payload, or its error's message.
struct Outcome {
  std::vector<std::byte> payload;
  std::optional<std::string> error;
};

// Runs `ranks` (rank, world size) as threads, rank 0 after `rank0_delay` so that the peers
// retry their connections first; returns the outcomes in the order given.
std::vector<Outcome> run_ranks(const RendezvousAddress& address, int64_t world_size,
                               const std::vector<int64_t>& ranks,
                               const std::vector<std::byte>& payload,
                               std::chrono::milliseconds rank0_timeout,
                               std::chrono::milliseconds peer_timeout,
                               std::chrono::milliseconds rank0_delay = 100ms) {
  std::vector<Outcome> outcomes(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      const int64_t rank = ranks[i];
      if (rank == 0) std::this_thread::sleep_for(rank0_delay);
      try {
        outcomes[i].payload = rendezvous_broadcast(
            address, rank, world_size,
            rank == 0 ? std::span<const std::byte>(payload) : std::span<const std::byte>(),
            rank == 0 ? rank0_timeout : peer_timeout);
      } catch (const common::Error& error) {
        outcomes[i].error = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

}  // namespace

TEST_CASE("rendezvous: four ranks on 127.0.0.1 get rank 0's payload, rank 0 starting last") {
  for (const size_t size : {size_t{128}, size_t{300000}, size_t{0}}) {
    const RendezvousAddress address{"127.0.0.1", free_port()};
    const std::vector<std::byte> payload = bytes_of(size, 7);
    const auto outcomes = run_ranks(address, 4, {0, 1, 2, 3}, payload, 20s, 20s);
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      INFO("rank " << rank << ", " << size << " bytes: " << outcomes[rank].error.value_or("ok"));
      CHECK_FALSE(outcomes[rank].error);
      CHECK(outcomes[rank].payload == payload);
    }
  }
}

TEST_CASE("rendezvous: a rank of a world of one gets its payload without the network") {
  const std::vector<std::byte> payload = bytes_of(16, 3);
  CHECK(rendezvous_broadcast({"", 0}, 0, 1, payload, 1ms) == payload);
}

TEST_CASE("rendezvous: rank 0 ignores a connection that is not a rank's") {
  const RendezvousAddress address{"127.0.0.1", free_port()};
  const std::vector<std::byte> payload = bytes_of(128, 11);
  std::thread stray([&] {
    // Connects as soon as rank 0 listens (after 100 ms), before the peers' retries reach it.
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < until) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in target{};
      target.sin_family = AF_INET;
      target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      target.sin_port = htons(static_cast<uint16_t>(address.port));
      if (::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof target) == 0) {
        const std::string request = "GET / HTTP/1.0\r\nHost: rendezvous\r\n\r\n";
        (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
        std::this_thread::sleep_for(100ms);
        ::close(fd);
        return;
      }
      ::close(fd);
      std::this_thread::sleep_for(5ms);
    }
  });
  // The peers come after the stray one, so rank 0 has read its hello by then.
  std::vector<Outcome> outcomes;
  std::thread ranks([&] { outcomes = run_ranks(address, 3, {0, 1, 2}, payload, 20s, 20s); });
  stray.join();
  ranks.join();
  for (const Outcome& outcome : outcomes) {
    INFO(outcome.error.value_or("ok"));
    CHECK_FALSE(outcome.error);
    CHECK(outcome.payload == payload);
  }
}

TEST_CASE("rendezvous: a peer with no listener fails within its timeout, naming host:port") {
  // Bound without listening for the whole test: connections are refused, and no test running
  // beside this one can take the port and answer (free_port's port could be handed out again).
  const BoundSocket held;
  const int port = held.port;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      rendezvous_broadcast({"127.0.0.1", port}, 3, 4, {}, 300ms),
      ("rank 3 could not reach the rendezvous at 127.0.0.1:" + std::to_string(port) +
       " (MASTER_ADDR/MASTER_PORT) within 0.3 s: connection refused")
          .c_str(),
      common::Error);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed >= 300ms);
  CHECK(elapsed < 5s);
  // A name that does not resolve is retried as long, then named the same way.
  CHECK_THROWS_WITH_AS(rendezvous_broadcast({"no-such-host.invalid", port}, 1, 2, {}, 200ms),
                       doctest::Contains("rank 1 could not reach the rendezvous at "
                                         "no-such-host.invalid:"),
                       common::Error);
}

TEST_CASE("rendezvous: rank 0 times out naming the missing ranks, and tells those that came") {
  const RendezvousAddress address{"127.0.0.1", free_port()};
  const auto outcomes = run_ranks(address, 5, {0, 1, 3}, bytes_of(128, 5), 1s, 20s, 0ms);
  const std::string expected = "rank 0 waited 1 s at the rendezvous on port " +
                               std::to_string(address.port) +
                               " (MASTER_PORT) and 2 of the other 4 ranks arrived; missing: "
                               "ranks 2, 4";
  REQUIRE(outcomes[0].error);
  CHECK(*outcomes[0].error == expected);
  for (size_t i : {size_t{1}, size_t{2}}) {
    REQUIRE(outcomes[i].error);
    CHECK(*outcomes[i].error ==
          "rank " + std::to_string(i == 1 ? 1 : 3) + ": rank 0 ended the rendezvous at 127.0.0.1:" +
              std::to_string(address.port) + " (MASTER_ADDR/MASTER_PORT): " + expected);
  }
}

TEST_CASE("rendezvous: a rank that arrives twice, or with another world size, is refused") {
  {
    const RendezvousAddress address{"127.0.0.1", free_port()};
    const auto outcomes = run_ranks(address, 3, {0, 1, 1}, bytes_of(8, 1), 20s, 20s);
    REQUIRE(outcomes[0].error);
    CHECK(outcomes[0].error->find("rank 1 arrived twice") != std::string::npos);
    CHECK(outcomes[0].error->find("two processes were given the same RANK") != std::string::npos);
    for (size_t i : {size_t{1}, size_t{2}}) {
      REQUIRE(outcomes[i].error);
      CHECK(outcomes[i].error->find("rank 1 arrived twice") != std::string::npos);
    }
  }
  {
    const RendezvousAddress address{"127.0.0.1", free_port()};
    std::vector<Outcome> outcomes(2);
    std::thread peer([&] {
      try {
        rendezvous_broadcast(address, 1, 3, {}, 20s);  // this one thinks the world has 3
      } catch (const common::Error& error) {
        outcomes[1].error = error.what();
      }
    });
    try {
      rendezvous_broadcast(address, 0, 2, bytes_of(8, 1), 20s);
    } catch (const common::Error& error) {
      outcomes[0].error = error.what();
    }
    peer.join();
    REQUIRE(outcomes[0].error);
    CHECK(outcomes[0].error->find("was started with world size 3, rank 0 with 2") !=
          std::string::npos);
    REQUIRE(outcomes[1].error);
    CHECK(outcomes[1].error->find("was started with world size 3, rank 0 with 2") !=
          std::string::npos);
  }
}

TEST_CASE("rendezvous: rank 0 names the port it cannot listen on") {
  BoundSocket taken;
  REQUIRE(::listen(taken.fd, 1) == 0);
  CHECK_THROWS_WITH_AS(rendezvous_broadcast({"127.0.0.1", taken.port}, 0, 2, {}, 1s),
                       ("rank 0 could not listen for the rendezvous on port " +
                        std::to_string(taken.port) + " (MASTER_PORT): address already in use")
                           .c_str(),
                       common::Error);
}

TEST_CASE("rendezvous: a port must be a number from 1 to 65535, and bad arguments are named") {
  CHECK(backend::parse_rendezvous_port("29500", "MASTER_PORT") == 29500);
  CHECK(backend::parse_rendezvous_port("1", "MASTER_PORT") == 1);
  CHECK(backend::parse_rendezvous_port("65535", "MASTER_PORT") == 65535);
  for (const char* text : {"", "abc", "0", "65536", "29500x", "-1", " 29500", "99999999999"}) {
    INFO("'" << text << "'");
    CHECK_THROWS_WITH_AS(
        backend::parse_rendezvous_port(text, "MASTER_PORT"),
        ("MASTER_PORT='" + std::string(text) + "' is not a port number (valid: 1 to 65535)")
            .c_str(),
        common::Error);
  }
  CHECK_THROWS_WITH_AS(rendezvous_broadcast({"127.0.0.1", 29500}, 4, 4, {}, 1s),
                       doctest::Contains("rank 4 of a world of 4"), common::Error);
  CHECK_THROWS_WITH_AS(rendezvous_broadcast({"127.0.0.1", 70000}, 1, 4, {}, 1s),
                       doctest::Contains("port 70000 (MASTER_PORT) is not one of 1 to 65535"),
                       common::Error);
  CHECK_THROWS_WITH_AS(rendezvous_broadcast({"", 29500}, 1, 4, {}, 1s),
                       doctest::Contains("set MASTER_ADDR"), common::Error);
}
