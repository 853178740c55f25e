// find_connected_socket and peer_has_closed (client_connection.hpp) on real loopback TCP
// connections made in this process: the lookup finds the accepted socket by its endpoints (not
// the client's end of the same connection, not the listener), and nothing for endpoints nobody
// has; the peer's close and its shutdown of sending count as closed, a pipelined request does
// not; ClientWatch answers the same through its lazy lookup. IPv6 loopback too, and an IPv4
// client of a dual-stack listener (v4-mapped addresses), where the machine has IPv6.
#include "backend/serve/client_connection.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

using namespace backend;

namespace {

// How a test's connection is made: over IPv4 or IPv6 loopback, or an IPv4 client of a
// dual-stack listener (on ::, as a server on --host :: listens), which sees it as ::ffff:a.b.c.d.
enum class Loopback { ipv4, ipv6, ipv4_client_of_dual_stack };

// A connected pair through a loopback listener: the client's end and the accepted end. Not
// connected when the machine has no IPv6 (for the IPv6 kinds).
struct LoopbackConnection {
  int listener = -1;
  int client = -1;
  int accepted = -1;
  ConnectionEndpoints server_view;  // the accepted end's endpoints, as a server sees them

  explicit LoopbackConnection(Loopback kind = Loopback::ipv4) {
    const bool ipv6_listener = kind != Loopback::ipv4;
    listener = socket(ipv6_listener ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (listener < 0 && ipv6_listener) return;  // a kernel without IPv6
    REQUIRE(listener >= 0);
    sockaddr_storage address{};
    socklen_t length = 0;
    if (ipv6_listener) {
      auto& ipv6 = reinterpret_cast<sockaddr_in6&>(address);
      ipv6.sin6_family = AF_INET6;
      ipv6.sin6_addr = kind == Loopback::ipv6 ? in6addr_loopback : in6addr_any;
      length = sizeof ipv6;
      if (kind == Loopback::ipv4_client_of_dual_stack) {
        int only_ipv6 = 0;
        setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &only_ipv6, sizeof only_ipv6);
      }
    } else {
      auto& ipv4 = reinterpret_cast<sockaddr_in&>(address);
      ipv4.sin_family = AF_INET;
      ipv4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      length = sizeof ipv4;
    }
    if (bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0) return;
    REQUIRE(listen(listener, 4) == 0);
    REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    const int port = port_of(address);
    if (kind == Loopback::ipv4_client_of_dual_stack) {
      // The listener's port, reached over IPv4.
      address = {};
      auto& ipv4 = reinterpret_cast<sockaddr_in&>(address);
      ipv4.sin_family = AF_INET;
      ipv4.sin_port = htons(static_cast<uint16_t>(port));
      ipv4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      length = sizeof ipv4;
    }
    client = socket(address.ss_family, SOCK_STREAM, 0);
    REQUIRE(client >= 0);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&address), length) == 0);
    accepted = accept(listener, nullptr, nullptr);
    REQUIRE(accepted >= 0);
    sockaddr_storage client_address{};
    socklen_t client_length = sizeof client_address;
    REQUIRE(getsockname(client, reinterpret_cast<sockaddr*>(&client_address), &client_length) ==
            0);
    const std::string loopback = kind == Loopback::ipv4   ? "127.0.0.1"
                                 : kind == Loopback::ipv6 ? "::1"
                                                          : "::ffff:127.0.0.1";
    server_view = {.local_address = loopback,
                   .local_port = port,
                   .remote_address = loopback,
                   .remote_port = port_of(client_address)};
  }
  ~LoopbackConnection() {
    for (int descriptor : {listener, client, accepted}) {
      if (descriptor >= 0) close(descriptor);
    }
  }
  LoopbackConnection(const LoopbackConnection&) = delete;
  LoopbackConnection& operator=(const LoopbackConnection&) = delete;

  bool connected() const { return accepted >= 0; }

  static int port_of(const sockaddr_storage& address) {
    return address.ss_family == AF_INET
               ? ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port)
               : ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
};

// The kernel takes the peer's FIN in at once on loopback; a moment's grace all the same.
bool closed_within_a_second(int socket) {
  for (int i = 0; i < 100; ++i) {
    if (peer_has_closed(socket)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("the accepted socket is found by its endpoints, and no other") {
  LoopbackConnection connection;
  REQUIRE(connection.connected());
  const auto found = find_connected_socket(connection.server_view);
  REQUIRE(found.has_value());
  CHECK(*found == connection.accepted);

  // The same connection seen from the client's end is the client's socket.
  const ConnectionEndpoints client_view{.local_address = connection.server_view.remote_address,
                                        .local_port = connection.server_view.remote_port,
                                        .remote_address = connection.server_view.local_address,
                                        .remote_port = connection.server_view.local_port};
  const auto client = find_connected_socket(client_view);
  REQUIRE(client.has_value());
  CHECK(*client == connection.client);

  // Endpoints nobody has: another remote port, another address, the listener's alone.
  ConnectionEndpoints other = connection.server_view;
  other.remote_port = other.remote_port == 65535 ? 1 : other.remote_port + 1;
  CHECK_FALSE(find_connected_socket(other).has_value());
  other = connection.server_view;
  other.remote_address = "127.0.0.2";
  CHECK_FALSE(find_connected_socket(other).has_value());
  other = connection.server_view;
  other.remote_address = "";
  other.remote_port = -1;
  CHECK_FALSE(find_connected_socket(other).has_value());
}

TEST_CASE("a client's close or shutdown counts as closed, but a pipelined request does not") {
  SUBCASE("close") {
    LoopbackConnection connection;
    REQUIRE(connection.connected());
    CHECK_FALSE(peer_has_closed(connection.accepted));
    REQUIRE(close(connection.client) == 0);
    connection.client = -1;
    CHECK(closed_within_a_second(connection.accepted));
  }
  SUBCASE("shutdown of its sending side") {
    LoopbackConnection connection;
    REQUIRE(connection.connected());
    REQUIRE(shutdown(connection.client, SHUT_WR) == 0);
    CHECK(closed_within_a_second(connection.accepted));
  }
  SUBCASE("more bytes, unread, while the connection stays open") {
    LoopbackConnection connection;
    REQUIRE(connection.connected());
    const std::string next = "PUT /api HTTP/1.1\r\n";
    REQUIRE(send(connection.client, next.data(), next.size(), 0) ==
            static_cast<ssize_t>(next.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(peer_has_closed(connection.accepted));
    // Nothing was read: the bytes are still there for the HTTP library.
    std::array<char, 64> buffer{};
    CHECK(recv(connection.accepted, buffer.data(), buffer.size(), MSG_DONTWAIT) ==
          static_cast<ssize_t>(next.size()));
  }
}

TEST_CASE("ClientWatch looks once, and an unknown connection is never closed") {
  LoopbackConnection connection;
  REQUIRE(connection.connected());
  ClientWatch watch(connection.server_view);
  CHECK_FALSE(watch.client_has_closed());
  REQUIRE(close(connection.client) == 0);
  connection.client = -1;
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    closed = watch.client_has_closed();
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(closed);

  ConnectionEndpoints nobody = connection.server_view;
  nobody.remote_port = nobody.remote_port == 65535 ? 1 : nobody.remote_port + 1;
  ClientWatch unknown(nobody);
  CHECK_FALSE(unknown.client_has_closed());
  CHECK_FALSE(unknown.client_has_closed());
}

TEST_CASE("IPv6 loopback connections are found too") {
  LoopbackConnection connection(Loopback::ipv6);
  if (!connection.connected()) {
    MESSAGE("this machine has no IPv6 loopback (::1); skipped");
    return;
  }
  const auto found = find_connected_socket(connection.server_view);
  REQUIRE(found.has_value());
  CHECK(*found == connection.accepted);
}

TEST_CASE("an IPv4 client of a dual-stack listener is found by its mapped addresses") {
  // A server on --host :: sees an IPv4 client as ::ffff:a.b.c.d, and so does the lookup.
  LoopbackConnection connection(Loopback::ipv4_client_of_dual_stack);
  if (!connection.connected()) {
    MESSAGE("this machine cannot listen on :: (no IPv6); skipped");
    return;
  }
  const auto found = find_connected_socket(connection.server_view);
  CHECK(found == std::optional<int>(connection.accepted));
  REQUIRE(close(connection.client) == 0);
  connection.client = -1;
  CHECK(closed_within_a_second(connection.accepted));
}
