// Whether the client of a request still waits for its answer: the text generation server stops
// generating for a client that has closed its connection (an abandoned request would otherwise
// keep its KV-cache slots and its place among --max-concurrent-requests until its last token).
//
// The HTTP library (cpp-httplib 0.11, Debian bookworm's) hands a handler the request's endpoints
// (local and remote address and port) but not its socket, and has no disconnect signal. A TCP
// connection is named by those four values, so the handler finds its socket among this process's
// descriptors (/proc/self/fd; getsockname and getpeername, addresses written by getnameinfo as
// the library writes them) and polls it for the peer's FIN without reading: POLLRDHUP (the peer
// closed, or shut down its sending side, as nginx's client-abort detection also reads it),
// POLLHUP or POLLERR. A pipelined next request (readable bytes) is not a hang-up. The socket
// stays the library's: it is open while the handler runs, and closed by the library after.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace backend {

// A TCP connection as seen from this process's end.
struct ConnectionEndpoints {
  std::string local_address;  // numeric, as getnameinfo(NI_NUMERICHOST) writes it
  int local_port = -1;
  std::string remote_address;
  int remote_port = -1;
};

// The descriptor of this process's TCP socket with these endpoints (borrowed: not owned), or
// nothing when there is none or the descriptors cannot be listed (no /proc).
std::optional<int> find_connected_socket(const ConnectionEndpoints& endpoints);

// True once the peer of a connected socket has closed the connection or shut down its sending
// side, or the connection failed; reads nothing, never blocks.
bool peer_has_closed(int socket);

// A request's client, watched lazily: the socket is looked for on the first question, so that
// requests answered before anyone asks cost nothing. Not found (no /proc): never closed.
class ClientWatch {
 public:
  explicit ClientWatch(ConnectionEndpoints endpoints) : endpoints_(std::move(endpoints)) {}
  bool client_has_closed();

 private:
  ConnectionEndpoints endpoints_;
  bool looked_ = false;
  std::optional<int> socket_;
};

}  // namespace backend
