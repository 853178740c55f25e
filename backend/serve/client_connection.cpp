// Finding a request's socket by its endpoints and polling it for the peer's hang-up
// (client_connection.hpp says why and how).
#include "backend/serve/client_connection.hpp"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <charconv>
#include <memory>
#include <string_view>

namespace backend {
namespace {

// The address and port of one end, in the form cpp-httplib gives a request's (numeric host).
bool endpoint_of(const sockaddr_storage& address, socklen_t length, std::string& host,
                 int& port) {
  if (address.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  } else if (address.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  } else {
    return false;
  }
  std::array<char, NI_MAXHOST> text{};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, text.data(),
                  static_cast<socklen_t>(text.size()), nullptr, 0, NI_NUMERICHOST) != 0) {
    return false;
  }
  host = text.data();
  return true;
}

// getsockname refuses what is not a socket (ENOTSOCK): files, pipes, the listing's own
// descriptor.
bool has_endpoints(int descriptor, const ConnectionEndpoints& wanted) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  std::string host;
  int port = -1;
  if (getsockname(descriptor, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      !endpoint_of(address, length, host, port) || port != wanted.local_port ||
      host != wanted.local_address) {
    return false;
  }
  length = sizeof address;
  // Fails (ENOTCONN) for a listening socket, which shares the local endpoint.
  if (getpeername(descriptor, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      !endpoint_of(address, length, host, port)) {
    return false;
  }
  return port == wanted.remote_port && host == wanted.remote_address;
}

}  // namespace

std::optional<int> find_connected_socket(const ConnectionEndpoints& endpoints) {
  const std::unique_ptr<DIR, int (*)(DIR*)> listing(opendir("/proc/self/fd"), closedir);
  if (!listing) return std::nullopt;
  while (const dirent* entry = readdir(listing.get())) {
    const std::string_view name = entry->d_name;
    int descriptor = -1;
    const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), descriptor);
    if (error != std::errc() || end != name.data() + name.size()) continue;  // "." and ".."
    if (has_endpoints(descriptor, endpoints)) return descriptor;
  }
  return std::nullopt;
}

bool peer_has_closed(int socket) {
  pollfd watched{.fd = socket, .events = POLLRDHUP, .revents = 0};
  if (poll(&watched, 1, 0) < 0) return false;  // EINTR or ENOMEM: ask again later
  return (watched.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

bool ClientWatch::client_has_closed() {
  if (!looked_) {
    socket_ = find_connected_socket(endpoints_);
    looked_ = true;
  }
  return socket_ && peer_has_closed(*socket_);
}

}  // namespace backend
