// The TCP rendezvous; see tcp_rendezvous.hpp for the protocol. POSIX sockets (TCP streams, so
// a read or write may move fewer bytes than asked: every transfer loops), non-blocking with
// poll() so that every wait, connect() included, ends at a deadline; EINTR is retried
// everywhere; sends carry MSG_NOSIGNAL, so a peer that went away is an error here rather than a
// SIGPIPE that ends the process. Sockets are close-on-exec: a child process must not keep the
// port open.
#include "backend/dist/tcp_rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<char, 4> kRendezvousMagic = {'M', 'N', 'R', 'V'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 4 + 4 + 8 + 8;
constexpr size_t kReplyHeaderBytes = 1 + 8;
constexpr uint8_t kAccepted = 0, kRefused = 1;
// A connection that says nothing holds rank 0's (sequential) accept loop up: peers say hello
// as soon as they connect, so one that is silent this long is not a rank.
constexpr std::chrono::seconds kHelloTimeout{10};
// One connect() to an address that drops packets ends here and is retried, so a second
// address of the host (IPv4 after IPv6) is tried before the whole timeout is spent.
constexpr std::chrono::seconds kConnectAttemptTimeout{10};

// The file descriptor of one socket, closed when this goes.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// "connection refused": the system's text, lower-cased to read inside a sentence.
std::string error_text(int error) {
  std::string text = std::system_category().message(error);
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

std::string seconds_text(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

// host:port, with an IPv6 address in brackets.
std::string endpoint(const RendezvousAddress& address) {
  return address.host.find(':') == std::string::npos
             ? fmt::format("{}:{}", address.host, address.port)
             : fmt::format("[{}]:{}", address.host, address.port);
}

int milliseconds_left(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// Waits until `fd` is ready for `events` (or has an error or hang-up, which the next call
// reports): false when the deadline passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, milliseconds_left(deadline));
    if (ready > 0) return true;
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) common::fail("the rendezvous's poll() failed: {}", error_text(errno));
  }
}

enum class Io { done, timed_out, closed, failed };
struct IoResult {
  Io status = Io::done;
  int error = 0;  // errno, for Io::failed
};

std::string io_text(const IoResult& result) {
  switch (result.status) {
    case Io::done:
      return "done";
    case Io::timed_out:
      return "timed out";
    case Io::closed:
      return "the other side closed the connection";
    case Io::failed:
      return error_text(result.error);
  }
  return "?";
}

IoResult write_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t count = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (count > 0) {
      sent += static_cast<size_t>(count);
    } else if (count < 0 && errno == EINTR) {
      continue;
    } else if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) return {Io::timed_out};
    } else {
      return {Io::failed, count < 0 ? errno : EPIPE};
    }
  }
  return {};
}

IoResult read_all(int fd, std::span<std::byte> bytes, Clock::time_point deadline) {
  size_t received = 0;
  while (received < bytes.size()) {
    const ssize_t count = ::recv(fd, bytes.data() + received, bytes.size() - received, 0);
    if (count > 0) {
      received += static_cast<size_t>(count);
    } else if (count == 0) {
      return {Io::closed};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return {Io::timed_out};
    } else {
      return {Io::failed, errno};
    }
  }
  return {};
}

void put_u64(std::byte* at, uint64_t value) {
  for (int i = 7; i >= 0; --i, value >>= 8) at[i] = static_cast<std::byte>(value & 0xFF);
}
uint64_t get_u64(const std::byte* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | std::to_integer<uint64_t>(at[i]);
  return value;
}
void put_u32(std::byte* at, uint32_t value) {
  for (int i = 3; i >= 0; --i, value >>= 8) at[i] = static_cast<std::byte>(value & 0xFF);
}
uint32_t get_u32(const std::byte* at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | std::to_integer<uint32_t>(at[i]);
  return value;
}

std::vector<std::byte> reply_message(uint8_t status, std::span<const std::byte> body) {
  std::vector<std::byte> message(kReplyHeaderBytes + body.size());
  message[0] = static_cast<std::byte>(status);
  put_u64(message.data() + 1, body.size());
  std::copy(body.begin(), body.end(), message.begin() + kReplyHeaderBytes);
  return message;
}

// "2, 5-7, 9": the ranks, ascending, with runs folded, so that a large world's list stays short.
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (!text.empty()) text += ", ";
    text += last == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[last]);
    i = last + 1;
  }
  return text;
}

// The numeric address of an accepted connection, for the warning about one that is not a rank.
std::string peer_text(const sockaddr_storage& address, socklen_t length) {
  char host[NI_MAXHOST] = {}, service[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, service,
                    sizeof service, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return fmt::format("{} port {}", host, service);
}

// ---- rank 0 ---------------------------------------------------------------------------------

// A socket listening on `port` on every interface: IPv6 with IPv4-mapped addresses (one socket
// for both), or IPv4 alone where the host has no IPv6.
Socket listen_on(int port, int64_t backlog) {
  int error = 0;
  for (const int family : {AF_INET6, AF_INET}) {
    Socket listener(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!listener.valid()) {
      error = errno;
      continue;
    }
    // A restarted job binds the port its predecessor's connections left in TIME_WAIT.
    const int on = 1, off = 0;
    ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    int status = 0;
    if (family == AF_INET6) {
      ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_addr = in6addr_any;
      address.sin6_port = htons(static_cast<uint16_t>(port));
      status = ::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_ANY);
      address.sin_port = htons(static_cast<uint16_t>(port));
      status = ::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
    }
    if (status == 0 &&
        ::listen(listener.fd(), static_cast<int>(std::min<int64_t>(backlog, SOMAXCONN))) == 0) {
      return listener;
    }
    error = errno;
    // The port is taken or privileged: IPv4 would say the same.
    if (error == EADDRINUSE || error == EACCES) break;
  }
  common::fail("rank 0 could not listen for the rendezvous on port {} (MASTER_PORT): {}", port,
               error_text(error));
}

class RendezvousServer {
 public:
  RendezvousServer(const RendezvousAddress& address, int64_t world_size,
                   std::span<const std::byte> payload, std::chrono::milliseconds timeout)
      : address_(address),
        world_size_(world_size),
        payload_(payload),
        timeout_(timeout),
        peers_(static_cast<size_t>(world_size)) {}

  void run() {
    const Clock::time_point deadline = Clock::now() + timeout_;
    const Socket listener = listen_on(address_.port, world_size_);
    int64_t arrived = 0;
    while (arrived < world_size_ - 1) {
      if (!wait_for(listener.fd(), POLLIN, deadline)) refuse_all(timeout_message(arrived));
      sockaddr_storage from{};
      socklen_t from_length = sizeof from;
      Socket connection(::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &from_length,
                                  SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!connection.valid()) {
        // Nothing to accept after all, or a connection that went before it was accepted.
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED ||
            errno == EPROTO) {
          continue;
        }
        common::fail("rank 0's rendezvous on port {} (MASTER_PORT) could not accept a "
                     "connection: {}", address_.port, error_text(errno));
      }
      if (admit(std::move(connection), peer_text(from, from_length), deadline)) ++arrived;
    }
    // Everyone is here: the payload to each. A rank that has gone since is named; the others
    // still get theirs first.
    const std::vector<std::byte> answer = reply_message(kAccepted, payload_);
    std::string failures;
    for (int64_t rank = 1; rank < world_size_; ++rank) {
      const IoResult sent =
          write_all(peers_[static_cast<size_t>(rank)].fd(), answer, Clock::now() + kHelloTimeout);
      if (sent.status == Io::done) continue;
      failures += fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", rank, io_text(sent));
    }
    if (!failures.empty()) {
      common::fail("rank 0 could not send the rendezvous's payload on port {} (MASTER_PORT) to {}",
                   address_.port, failures);
    }
  }

 private:
  // Reads a hello and keeps the connection as its rank's: true for a new rank. A connection
  // that is not a rank's is closed and ignored; a rank that is wrong is refused, which ends
  // the rendezvous for everyone.
  bool admit(Socket connection, const std::string& from, Clock::time_point deadline) {
    std::array<std::byte, kHelloBytes> hello{};
    const IoResult read =
        read_all(connection.fd(), hello, std::min(deadline, Clock::now() + kHelloTimeout));
    if (read.status != Io::done || std::memcmp(hello.data(), kRendezvousMagic.data(), kRendezvousMagic.size()) != 0) {
      spdlog::warn(
          "rank 0's rendezvous on port {} (MASTER_PORT) ignored a connection from {} "
          "that did not say hello as a rank does ({})",
          address_.port, from, read.status == Io::done ? "another protocol" : io_text(read));
      return false;
    }
    const uint32_t version = get_u32(hello.data() + 4);
    const uint64_t rank = get_u64(hello.data() + 8), size = get_u64(hello.data() + 16);
    std::string reason;
    if (version != kVersion) {
      reason = fmt::format(
          "a rank from {} speaks rendezvous protocol version {}, rank 0 version "
          "{}: every rank must run the same build",
          from, version, kVersion);
    } else if (size != static_cast<uint64_t>(world_size_)) {
      reason = fmt::format("rank {} (from {}) was started with world size {}, rank 0 with {}", rank,
                           from, size, world_size_);
    } else if (rank < 1 || rank >= static_cast<uint64_t>(world_size_)) {
      reason = fmt::format("a process from {} says it is rank {}, which is not one of 1 to {}",
                           from, rank, world_size_ - 1);
    } else if (peers_[rank].valid()) {
      reason = fmt::format(
          "rank {} arrived twice (the second from {}): two processes were "
          "given the same RANK",
          rank, from);
    }
    if (!reason.empty()) {
      peers_[0] = std::move(connection);  // slot 0 is rank 0's own: free for the one refused
      refuse_all(reason);
    }
    peers_[rank] = std::move(connection);
    return true;
  }

  std::string timeout_message(int64_t arrived) const {
    std::vector<int64_t> missing;
    for (int64_t rank = 1; rank < world_size_; ++rank) {
      if (!peers_[static_cast<size_t>(rank)].valid()) missing.push_back(rank);
    }
    return fmt::format(
        "rank 0 waited {} at the rendezvous on port {} (MASTER_PORT) and {} of "
        "the other {} ranks arrived; missing: {} {}",
        seconds_text(timeout_), address_.port, arrived, world_size_ - 1,
        missing.size() == 1 ? "rank" : "ranks", rank_list(missing));
  }

  // Tells every rank that has arrived why the rendezvous failed (so they fail with the reason
  // at once, rather than wait for an answer), then fails with it here.
  [[noreturn]] void refuse_all(const std::string& reason) {
    const auto text = std::as_bytes(std::span(reason.data(), reason.size()));
    const std::vector<std::byte> refusal = reply_message(kRefused, text);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    for (Socket& peer : peers_) {
      if (peer.valid()) write_all(peer.fd(), refusal, deadline);  // best effort
    }
    common::fail("{}", reason);
  }

  RendezvousAddress address_;
  int64_t world_size_;
  std::span<const std::byte> payload_;
  std::chrono::milliseconds timeout_;
  std::vector<Socket> peers_;  // by rank; [0] holds a connection being refused
};

// ---- the other ranks ------------------------------------------------------------------------

// One connect() to one resolved address: the socket, or nothing with the error in `error`.
Socket connect_once(const addrinfo& candidate, Clock::time_point deadline, std::string& error) {
  Socket socket(::socket(candidate.ai_family, candidate.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         candidate.ai_protocol));
  if (!socket.valid()) {
    error = error_text(errno);
    return {};
  }
  if (::connect(socket.fd(), candidate.ai_addr, candidate.ai_addrlen) == 0) return socket;
  // A non-blocking connect, or one that a signal interrupted, goes on in the background.
  if (errno != EINPROGRESS && errno != EINTR) {
    error = error_text(errno);
    return {};
  }
  if (!wait_for(socket.fd(), POLLOUT, std::min(deadline, Clock::now() + kConnectAttemptTimeout))) {
    error = "connection timed out";
    return {};
  }
  int status = 0;
  socklen_t length = sizeof status;
  if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &status, &length) != 0) status = errno;
  if (status != 0) {
    error = error_text(status);
    return {};
  }
  return socket;
}

// A connection to rank 0 that has said hello, retried until the deadline: rank 0 may not be
// listening yet, nor its name resolvable (a container's DNS entry appears when it starts).
Socket connect_and_say_hello(const RendezvousAddress& address, int64_t rank, int64_t world_size,
                             std::chrono::milliseconds timeout, Clock::time_point deadline) {
  std::array<std::byte, kHelloBytes> hello{};
  std::memcpy(hello.data(), kRendezvousMagic.data(), kRendezvousMagic.size());
  put_u32(hello.data() + 4, kVersion);
  put_u64(hello.data() + 8, static_cast<uint64_t>(rank));
  put_u64(hello.data() + 16, static_cast<uint64_t>(world_size));
  const std::string port = std::to_string(address.port);
  std::string error = "no attempt was made";
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int resolved = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found);
    if (resolved != 0) {
      error = resolved == EAI_SYSTEM
                  ? error_text(errno)
                  : fmt::format("cannot resolve the name ({})", ::gai_strerror(resolved));
    } else {
      const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
      for (const addrinfo* candidate = found; candidate != nullptr;
           candidate = candidate->ai_next) {
        Socket socket = connect_once(*candidate, deadline, error);
        if (!socket.valid()) continue;
        const IoResult sent = write_all(socket.fd(), hello, deadline);
        if (sent.status == Io::done) return socket;
        error = io_text(sent);  // a listener that went away as we came: try again
      }
    }
    if (Clock::now() >= deadline) {
      common::fail(
          "rank {} could not reach the rendezvous at {} (MASTER_ADDR/MASTER_PORT) "
          "within {}: {}",
          rank, endpoint(address), seconds_text(timeout), error);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
}

std::vector<std::byte> receive_payload(const RendezvousAddress& address, int64_t rank,
                                       int64_t world_size, std::chrono::milliseconds timeout) {
  const Socket socket =
      connect_and_say_hello(address, rank, world_size, timeout, Clock::now() + timeout);
  // Rank 0 answers within its own timeout, which began before this connection was accepted.
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string where =
      fmt::format("the rendezvous at {} (MASTER_ADDR/MASTER_PORT)", endpoint(address));
  std::array<std::byte, kReplyHeaderBytes> header{};
  const IoResult read = read_all(socket.fd(), header, deadline);
  if (read.status == Io::timed_out) {
    common::fail("rank {} reached {} but rank 0 sent nothing within {}", rank, where,
                 seconds_text(timeout));
  }
  if (read.status != Io::done) {
    common::fail("rank {} lost its connection to {} before rank 0 answered: {}", rank, where,
                 io_text(read));
  }
  const auto status = std::to_integer<uint8_t>(header[0]);
  const uint64_t length = get_u64(header.data() + 1);
  if ((status != kAccepted && status != kRefused) || length > kMaxRendezvousPayloadBytes) {
    common::fail(
        "rank {} got an answer from {} that is not this rendezvous's (status {}, {} "
        "bytes): is MASTER_PORT another service's port?",
        rank, where, status, length);
  }
  std::vector<std::byte> body(static_cast<size_t>(length));
  const IoResult body_read = read_all(socket.fd(), body, deadline);
  if (body_read.status != Io::done) {
    common::fail("rank {} lost its connection to {} while rank 0 answered: {}", rank, where,
                 io_text(body_read));
  }
  if (status == kRefused) {
    common::fail("rank {}: rank 0 ended {}: {}", rank, where,
                 std::string(reinterpret_cast<const char*>(body.data()), body.size()));
  }
  return body;
}

}  // namespace

int parse_rendezvous_port(std::string_view text, std::string_view variable) {
  int port = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || port < 1 ||
      port > 65535) {
    common::fail("{}='{}' is not a port number (valid: 1 to 65535)", variable, text);
  }
  return port;
}

std::vector<std::byte> rendezvous_broadcast(const RendezvousAddress& address, int64_t rank,
                                            int64_t world_size,
                                            std::span<const std::byte> payload_on_rank0,
                                            std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    common::fail(
        "the rendezvous was asked for rank {} of a world of {} (valid: 0 to world size "
        "- 1, world size at least 1)",
        rank, world_size);
  }
  if (timeout <= std::chrono::milliseconds(0)) {
    common::fail("the rendezvous's timeout is {} ms; it must be positive", timeout.count());
  }
  if (rank == 0 && payload_on_rank0.size() > kMaxRendezvousPayloadBytes) {
    common::fail("the rendezvous carries at most {} bytes, not {}", kMaxRendezvousPayloadBytes,
                 payload_on_rank0.size());
  }
  if (world_size == 1) return {payload_on_rank0.begin(), payload_on_rank0.end()};
  if (address.port < 1 || address.port > 65535) {
    common::fail("the rendezvous's port {} (MASTER_PORT) is not one of 1 to 65535", address.port);
  }
  if (rank == 0) {
    RendezvousServer(address, world_size, payload_on_rank0, timeout).run();
    return {payload_on_rank0.begin(), payload_on_rank0.end()};
  }
  if (address.host.empty()) {
    common::fail(
        "rank {} has no host for the rendezvous: set MASTER_ADDR to rank 0's host name "
        "or address",
        rank);
  }
  return receive_payload(address, rank, world_size, timeout);
}

}  // namespace backend
