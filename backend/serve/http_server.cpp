// The HTTP/1.1 server's event loop and handler threads (http_server.hpp says what is bounded and
// how). Each connection is a state machine driven by epoll's level-triggered events: idle →
// head (request line and header fields, line by line) → body (by Content-Length, or chunk by
// chunk: size line, data, CRLF, ..., the last chunk and trailer fields) → waiting (the handler
// has the request; only the client's hang-up is watched, so pipelined bytes wait in the kernel)
// → writing → idle again (keep-alive) or lingering → closed. Deadlines are kept in one ordered
// set, so the loop sleeps until the nearest one.
#include "backend/serve/http_server.hpp"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "backend/common/error.hpp"

namespace backend {

namespace {

using Clock = std::chrono::steady_clock;
constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

// One recv's bytes; the most one connection reads per event, so that a fast sender does not
// starve the others (epoll reports it again).
constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kMostReadPerEvent = 256 << 10;
// A chunk-size line (hex digits and chunk extensions, which are ignored).
constexpr size_t kMostChunkLineBytes = 4096;
// After accept fails for want of descriptors or memory, the listener rests this long.
constexpr std::chrono::milliseconds kAcceptPause{100};

constexpr uint64_t kListenerKey = 1;
constexpr uint64_t kWakeKey = 2;
constexpr uint64_t kFirstConnectionKey = 16;

// RFC 9110's tchar.
bool is_token_char(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return is_token_char(static_cast<unsigned char>(c));
  });
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x >= 'A' && x <= 'Z' ? x | 0x20 : x) == (y >= 'A' && y <= 'Z' ? y | 0x20 : y);
         });
}

// Without RFC 9110's optional whitespace (spaces and tabs) at either end.
std::string_view trim_optional_whitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::vector<std::string_view> comma_list(std::string_view text) {
  std::vector<std::string_view> items;
  for (;;) {
    const size_t comma = text.find(',');
    const std::string_view item = trim_optional_whitespace(text.substr(0, comma));
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) return items;
    text.remove_prefix(comma + 1);
  }
}

std::string seconds_text(std::chrono::milliseconds duration) {
  return fmt::format("{} s", static_cast<double>(duration.count()) / 1000.0);
}

std::string serialize(const HttpResponse& response, bool keep_alive, bool head_only) {
  std::string text =
      fmt::format("HTTP/1.1 {} {}\r\n", response.status, http_reason_phrase(response.status));
  auto safe = [](std::string_view field) {
    return field.find_first_of("\r\n") == std::string_view::npos;
  };
  if (!response.content_type.empty() && safe(response.content_type)) {
    text += "Content-Type: " + response.content_type + "\r\n";
  }
  for (const HttpHeader& header : response.headers) {
    if (is_token(header.name) && safe(header.value)) {
      text += header.name + ": " + header.value + "\r\n";
    }
  }
  text += fmt::format("Content-Length: {}\r\n", response.body.size());
  if (!keep_alive) text += "Connection: close\r\n";
  text += "\r\n";
  if (!head_only) text += response.body;
  return text;
}

// A descriptor closed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string system_message(int error) {
  return std::system_category().message(error);
}

}  // namespace

std::string_view http_reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";  // nginx's
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const HttpHeader& field : headers) {
    if (equals_ignoring_case(field.name, name)) return &field.value;
  }
  return nullptr;
}

// ---- what the loop shares with the handler threads and the responders

struct HttpServer::Core {
  HttpErrorResponse error_response;

  std::mutex mutex;  // guards what follows, up to the statistics
  std::condition_variable work_ready;
  std::deque<std::function<void()>> tasks;  // for the handler threads
  bool threads_stopping = false;
  std::deque<std::pair<uint64_t, HttpResponse>> answers;  // (connection, response), for the loop
  bool stop_requested = false;

  Descriptor wake;  // an eventfd in the loop's epoll set

  std::atomic<int64_t> connections_accepted = 0;
  std::atomic<int64_t> connections_refused = 0;
  std::atomic<int64_t> requests = 0;
  std::atomic<int64_t> refusals = 0;
  std::atomic<int64_t> timeouts = 0;
  std::atomic<int64_t> most_buffered_bytes = 0;

  HttpResponse error(int status, const std::string& message) const {
    if (error_response) return error_response(status, message);
    return HttpResponse{.status = status,
                        .content_type = "text/plain; charset=utf-8",
                        .headers = {},
                        .body = message + "\n"};
  }
  void wake_loop() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = write(wake.get(), &one, sizeof one);
  }
  // Dropped once the threads stop (the task's responders then answer 500 to nobody).
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex);
      if (threads_stopping) return;
      tasks.push_back(std::move(task));
    }
    work_ready.notify_one();
  }
  void answer(uint64_t connection, HttpResponse response) {
    {
      std::lock_guard lock(mutex);
      answers.emplace_back(connection, std::move(response));
    }
    wake_loop();
  }
};

struct HttpResponder::Exchange {
  std::shared_ptr<HttpServer::Core> core;
  uint64_t connection = 0;
  std::stop_source client_gone;
  std::atomic<bool> answered = false;

  ~Exchange() {
    if (!answered.exchange(true)) {
      core->answer(connection, core->error(500, "internal error: the request got no response"));
    }
  }
};

void HttpResponder::respond(HttpResponse response) const {
  if (exchange_->answered.exchange(true)) return;
  exchange_->core->answer(exchange_->connection, std::move(response));
}

void HttpResponder::respond_with(std::function<HttpResponse()> make) const {
  exchange_->core->post([exchange = exchange_, make = std::move(make)] {
    HttpResponse response;
    try {
      response = make();
    } catch (const std::exception& error) {
      response = exchange->core->error(500, fmt::format("internal error: {}", error.what()));
    }
    HttpResponder(exchange).respond(std::move(response));
  });
}

std::stop_token HttpResponder::client_gone() const {
  return exchange_->client_gone.get_token();
}

// ---- the event loop

class HttpServer::Loop {
 public:
  Loop(HttpServerOptions options, HttpHandler handler, std::shared_ptr<Core> core);
  ~Loop();
  int port() const { return port_; }
  void run();

 private:
  enum class Phase { idle, head, body, waiting, writing, lingering };
  enum class Framing { none, length, chunked };
  enum class ChunkPart { size_line, data, data_end, trailers };

  struct Connection {
    int fd = -1;
    uint64_t id = 0;
    std::string remote_address;
    int remote_port = 0;
    Phase phase = Phase::idle;
    uint32_t interest = 0;  // the epoll events asked for
    Clock::time_point deadline = kNoDeadline;
    bool peer_closed = false;  // the client sent its FIN (or shut down its sending side)
    std::string in;            // received; in[in_start..] is not consumed yet
    size_t in_start = 0;
    // The request being read.
    HttpRequest request;
    bool request_line_read = false;
    int64_t head_bytes = 0;  // of the request line, header and trailer fields
    int64_t header_count = 0;
    Framing framing = Framing::none;
    ChunkPart chunk_part = ChunkPart::size_line;
    int64_t body_remaining = 0;    // Content-Length bytes, or the current chunk's, still to read
    bool send_continue = false;    // `Expect: 100-continue`, to answer before the body
    bool keep_alive = true;        // after this request's response
    bool head_only = false;        // a HEAD request: the response without its body
    std::stop_source client_gone;  // the request's, while it waits
    std::string out;
    size_t out_written = 0;
  };

  // What one parse step came to.
  struct Step {
    enum Kind { more, progressed, complete, refused } kind = more;
    int status = 0;
    std::string message;
  };
  static Step step(Step::Kind kind) {
    Step result;
    result.kind = kind;
    return result;
  }
  static Step refusal(int status, std::string message) {
    Step result;
    result.kind = Step::refused;
    result.status = status;
    result.message = std::move(message);
    return result;
  }

  void listen_on(const std::string& host, int port);
  void start_threads(int count);
  void stop_threads();
  void handler_thread();

  Clock::time_point now() const { return Clock::now(); }
  int wait_milliseconds(Clock::time_point now) const;
  void set_deadline(Connection& c, Clock::time_point deadline);
  void update_interest(Connection& c);
  void note_buffered(const Connection& c);

  void accept_connections();
  void refuse_connection(int fd);
  void take_wake();
  void begin_stop();
  void close_connection(Connection& c);
  void on_event(Connection& c, uint32_t events);
  void on_deadline(Connection& c);

  // Each returns false when it closed the connection (`c` is gone then).
  bool read_request(Connection& c);
  bool process_input(Connection& c);
  bool dispatch(Connection& c);
  bool refuse(Connection& c, int status, const std::string& message);
  bool start_response(Connection& c, const HttpResponse& response);
  bool flush(Connection& c);
  bool finish_response(Connection& c);
  bool drain(Connection& c);

  void begin_request(Connection& c);
  Step parse_fields(Connection& c, bool trailers);
  Step parse_request_line(Connection& c, std::string_view line);
  Step interpret_head(Connection& c);
  Step parse_body(Connection& c);
  Step body_too_large() const;

  HttpServerOptions options_;
  std::shared_ptr<const HttpHandler> handler_;
  std::shared_ptr<Core> core_;
  Descriptor epoll_;
  Descriptor listener_;
  int port_ = 0;
  std::vector<std::thread> threads_;

  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_;
  uint64_t next_id_ = kFirstConnectionKey;
  bool listener_paused_ = false;
  Clock::time_point listener_resume_ = kNoDeadline;
  bool stopping_ = false;
  Clock::time_point stop_deadline_ = kNoDeadline;
};

HttpServer::Loop::Loop(HttpServerOptions options, HttpHandler handler, std::shared_ptr<Core> core)
    : options_(std::move(options)),
      handler_(std::make_shared<const HttpHandler>(std::move(handler))),
      core_(std::move(core)) {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (epoll_.get() < 0) common::fail("the HTTP server: epoll_create1: {}", system_message(errno));
  core_->wake.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (core_->wake.get() < 0) common::fail("the HTTP server: eventfd: {}", system_message(errno));
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.u64 = kWakeKey;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, core_->wake.get(), &wake) != 0) {
    common::fail("the HTTP server: epoll_ctl: {}", system_message(errno));
  }
  listen_on(options_.host, options_.port);
  start_threads(std::max(1, options_.handler_threads));
}

HttpServer::Loop::~Loop() {
  stop_threads();
  std::vector<uint64_t> ids;
  for (const auto& entry : connections_) ids.push_back(entry.first);
  for (const uint64_t id : ids) close_connection(*connections_.at(id));
}

void HttpServer::Loop::listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int resolved =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (resolved != 0) {
    common::fail("cannot listen on {} port {}: {}", host, port, gai_strerror(resolved));
  }
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  int last_error = EADDRNOTAVAIL;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    Descriptor fd(socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         address->ai_protocol));
    if (fd.get() < 0) {
      last_error = errno;
      continue;
    }
    const int yes = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    // SOMAXCONN: as many waiting connections as the kernel allows (net.core.somaxconn).
    if (bind(fd.get(), address->ai_addr, address->ai_addrlen) != 0 ||
        listen(fd.get(), SOMAXCONN) != 0) {
      last_error = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      last_error = errno;
      continue;
    }
    port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(bound).sin6_port
                                          : reinterpret_cast<const sockaddr_in&>(bound).sin_port);
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kListenerKey;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &event) != 0) {
      common::fail("the HTTP server: epoll_ctl: {}", system_message(errno));
    }
    listener_.reset(fd.release());
    return;
  }
  common::fail("cannot listen on {} port {}: {}", host, port, system_message(last_error));
}

void HttpServer::Loop::start_threads(int count) {
  try {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { handler_thread(); });
  } catch (const std::system_error& error) {
    stop_threads();
    common::fail("the HTTP server cannot start its {} handler threads: {}", count, error.what());
  }
}

void HttpServer::Loop::stop_threads() {
  {
    std::lock_guard lock(core_->mutex);
    core_->threads_stopping = true;
  }
  core_->work_ready.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
  // Tasks nobody will run: destroyed outside the lock, since their responders answer 500
  // through it.
  std::deque<std::function<void()>> left;
  {
    std::lock_guard lock(core_->mutex);
    left.swap(core_->tasks);
  }
}

void HttpServer::Loop::handler_thread() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(core_->mutex);
      core_->work_ready.wait(lock,
                             [&] { return core_->threads_stopping || !core_->tasks.empty(); });
      if (core_->threads_stopping) return;
      task = std::move(core_->tasks.front());
      core_->tasks.pop_front();
    }
    try {
      task();
    } catch (...) {
      // Tasks answer their own failures; a throw from that answer leaves a 500 to the
      // responder's destructor.
    }
  }
}

void HttpServer::Loop::run() {
  std::array<epoll_event, 128> events{};
  for (;;) {
    const int ready = epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                                 wait_milliseconds(now()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      common::fail("the HTTP server: epoll_wait: {}", system_message(errno));
    }
    for (int i = 0; i < ready; ++i) {
      const uint64_t key = events[static_cast<size_t>(i)].data.u64;
      if (key == kListenerKey) {
        if (!stopping_) accept_connections();
      } else if (key == kWakeKey) {
        take_wake();
      } else if (const auto found = connections_.find(key); found != connections_.end()) {
        on_event(*found->second, events[static_cast<size_t>(i)].events);
      }
    }
    const Clock::time_point time = now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= time) {
      on_deadline(*connections_.at(deadlines_.begin()->second));
    }
    if (listener_paused_ && !stopping_ && time >= listener_resume_) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = kListenerKey;
      if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &event) == 0) {
        listener_paused_ = false;
      } else {
        listener_resume_ = time + kAcceptPause;
      }
    }
    if (stopping_ && (connections_.empty() || time >= stop_deadline_)) break;
  }
  std::vector<uint64_t> ids;
  for (const auto& entry : connections_) ids.push_back(entry.first);
  for (const uint64_t id : ids) close_connection(*connections_.at(id));
}

int HttpServer::Loop::wait_milliseconds(Clock::time_point time) const {
  Clock::time_point next = kNoDeadline;
  if (!deadlines_.empty()) next = deadlines_.begin()->first;
  if (listener_paused_) next = std::min(next, listener_resume_);
  if (stopping_) next = std::min(next, stop_deadline_);
  if (next == kNoDeadline) return -1;
  if (next <= time) return 0;
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - time).count();
  return static_cast<int>(std::min<int64_t>(wait, 60'000));
}

void HttpServer::Loop::set_deadline(Connection& c, Clock::time_point deadline) {
  if (c.deadline != kNoDeadline) deadlines_.erase({c.deadline, c.id});
  c.deadline = deadline;
  if (deadline != kNoDeadline) deadlines_.insert({deadline, c.id});
}

void HttpServer::Loop::update_interest(Connection& c) {
  uint32_t wanted = 0;
  switch (c.phase) {
    case Phase::idle:
    case Phase::head:
    case Phase::body:
      wanted = EPOLLIN | EPOLLRDHUP | (c.out_written < c.out.size() ? EPOLLOUT : 0u);
      break;
    case Phase::waiting:
      // Not EPOLLIN: a pipelined next request waits in the kernel until this one is answered.
      wanted = c.peer_closed ? 0u : EPOLLRDHUP;
      break;
    case Phase::writing:
      wanted = EPOLLOUT | (c.peer_closed ? 0u : EPOLLRDHUP);
      break;
    case Phase::lingering:
      wanted = EPOLLIN | EPOLLRDHUP;
      break;
  }
  if (wanted == c.interest) return;
  epoll_event event{};
  event.events = wanted;
  event.data.u64 = c.id;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd, &event);
  c.interest = wanted;
}

void HttpServer::Loop::note_buffered(const Connection& c) {
  const auto held = static_cast<int64_t>(c.in.size() + c.request.body.size());
  if (held > core_->most_buffered_bytes.load()) core_->most_buffered_bytes.store(held);
}

void HttpServer::Loop::accept_connections() {
  for (int accepted = 0; accepted < 256; ++accepted) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection stays in the backlog, and the
      // listener, still readable, would spin the loop: it rests a moment.
      spdlog::warn("the HTTP server cannot accept a connection ({}); it tries again in {} ms",
                   system_message(errno), kAcceptPause.count());
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
      listener_paused_ = true;
      listener_resume_ = now() + kAcceptPause;
      return;
    }
    if (std::ssize(connections_) >= options_.max_connections) {
      refuse_connection(fd);
      continue;
    }
    ++core_->connections_accepted;
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    auto connection = std::make_unique<Connection>();
    Connection& c = *connection;
    c.fd = fd;
    c.id = next_id_++;
    std::array<char, NI_MAXHOST> host{};
    std::array<char, NI_MAXSERV> service{};
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host.data(),
                    static_cast<socklen_t>(host.size()), service.data(),
                    static_cast<socklen_t>(service.size()), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      c.remote_address = host.data();
      c.remote_port = std::atoi(service.data());
    }
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = c.id;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      close(fd);
      continue;
    }
    c.interest = event.events;
    connections_.emplace(c.id, std::move(connection));
    set_deadline(c, now() + options_.idle_timeout);
  }
}

void HttpServer::Loop::refuse_connection(int fd) {
  ++core_->connections_refused;
  const std::string text = serialize(
      core_->error(503, fmt::format("the server has {} connections open, its limit; try again "
                                    "later",
                                    options_.max_connections)),
      false, false);
  // A new connection's send buffer is empty: the answer fits, or the client is gone already.
  [[maybe_unused]] const ssize_t sent =
      send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

void HttpServer::Loop::take_wake() {
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t read_bytes = read(core_->wake.get(), &count, sizeof count);
  std::deque<std::pair<uint64_t, HttpResponse>> answers;
  bool stop = false;
  {
    std::lock_guard lock(core_->mutex);
    answers.swap(core_->answers);
    stop = core_->stop_requested;
  }
  for (auto& answer : answers) {
    const auto found = connections_.find(answer.first);
    // A connection closed meanwhile (its client gone): nobody to tell.
    if (found == connections_.end() || found->second->phase != Phase::waiting) continue;
    start_response(*found->second, answer.second);
  }
  if (stop && !stopping_) begin_stop();
}

void HttpServer::Loop::begin_stop() {
  stopping_ = true;
  stop_deadline_ = now() + options_.write_timeout;
  if (!listener_paused_) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
  listener_.reset();
  std::vector<uint64_t> ids;
  for (const auto& entry : connections_) ids.push_back(entry.first);
  for (const uint64_t id : ids) {
    Connection& c = *connections_.at(id);
    if ((c.phase == Phase::waiting || c.phase == Phase::writing) && !c.peer_closed) {
      c.keep_alive = false;  // answered, then closed
    } else {
      close_connection(c);
    }
  }
}

void HttpServer::Loop::close_connection(Connection& c) {
  // A request still waiting for its answer: nobody will read it.
  c.client_gone.request_stop();
  close(c.fd);
  set_deadline(c, kNoDeadline);
  connections_.erase(c.id);
}

void HttpServer::Loop::on_event(Connection& c, uint32_t events) {
  if ((events & (EPOLLERR | EPOLLHUP)) != 0) {
    // Reset, or closed both ways: nothing can be read or written any more.
    close_connection(c);
    return;
  }
  switch (c.phase) {
    case Phase::idle:
    case Phase::head:
    case Phase::body:
      if ((events & EPOLLOUT) != 0 && !flush(c)) return;
      if ((events & (EPOLLIN | EPOLLRDHUP)) != 0) read_request(c);
      return;
    case Phase::waiting:
      if ((events & EPOLLRDHUP) != 0) {
        // The client closed its connection, or shut down its sending side, as nginx reads it:
        // its request is stopped; an answer that still comes is written, if it can be.
        c.peer_closed = true;
        c.keep_alive = false;
        c.client_gone.request_stop();
        update_interest(c);
      }
      return;
    case Phase::writing:
      if ((events & EPOLLRDHUP) != 0) {
        c.peer_closed = true;
        c.keep_alive = false;
      }
      if ((events & EPOLLOUT) != 0) {
        flush(c);
      } else {
        update_interest(c);
      }
      return;
    case Phase::lingering:
      drain(c);
      return;
  }
}

void HttpServer::Loop::on_deadline(Connection& c) {
  set_deadline(c, kNoDeadline);
  switch (c.phase) {
    case Phase::head:
    case Phase::body:
      ++core_->timeouts;
      refuse(c, 408,
             fmt::format("the request did not arrive whole within {}",
                         seconds_text(options_.request_timeout)));
      return;
    case Phase::writing:
      ++core_->timeouts;
      close_connection(c);
      return;
    case Phase::waiting:
      return;
    case Phase::idle:
    case Phase::lingering:
      close_connection(c);
      return;
  }
}

bool HttpServer::Loop::read_request(Connection& c) {
  std::array<char, kReadChunk> buffer{};
  size_t total = 0;
  while (total < kMostReadPerEvent) {
    const ssize_t received = recv(c.fd, buffer.data(), buffer.size(), 0);
    if (received > 0) {
      total += static_cast<size_t>(received);
      c.in.append(buffer.data(), static_cast<size_t>(received));
      if (!process_input(c)) return false;
      if (c.phase != Phase::idle && c.phase != Phase::head && c.phase != Phase::body) return true;
      continue;
    }
    if (received == 0) {
      c.peer_closed = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    close_connection(c);
    return false;
  }
  if (c.peer_closed) {
    // A request cut short, or none: nobody to answer.
    close_connection(c);
    return false;
  }
  update_interest(c);
  return true;
}

bool HttpServer::Loop::process_input(Connection& c) {
  for (;;) {
    Step result;
    switch (c.phase) {
      case Phase::idle:
        if (c.in_start == c.in.size()) {
          c.in.clear();
          c.in_start = 0;
          return true;
        }
        begin_request(c);
        continue;
      case Phase::head:
        result = parse_fields(c, false);
        break;
      case Phase::body:
        result = parse_body(c);
        break;
      default:
        return true;
    }
    note_buffered(c);
    if (result.kind == Step::refused) return refuse(c, result.status, result.message);
    if (result.kind == Step::complete) return dispatch(c);
    if (c.send_continue) {
      c.send_continue = false;
      c.out += "HTTP/1.1 100 Continue\r\n\r\n";
      if (!flush(c)) return false;
    }
    if (result.kind == Step::more) {
      // What is consumed is not kept.
      if (c.in_start == c.in.size() || c.in_start >= (64u << 10)) {
        c.in.erase(0, c.in_start);
        c.in_start = 0;
      }
      return true;
    }
  }
}

void HttpServer::Loop::begin_request(Connection& c) {
  c.phase = Phase::head;
  c.request = HttpRequest{};
  c.request_line_read = false;
  c.head_bytes = 0;
  c.header_count = 0;
  c.framing = Framing::none;
  c.chunk_part = ChunkPart::size_line;
  c.body_remaining = 0;
  c.send_continue = false;
  c.keep_alive = true;
  c.head_only = false;
  c.client_gone = std::stop_source();
  // One deadline for the whole request, from its first byte: however slowly the bytes come.
  set_deadline(c, now() + options_.request_timeout);
}

HttpServer::Loop::Step HttpServer::Loop::parse_fields(Connection& c, bool trailers) {
  const auto max_header_bytes = options_.max_header_bytes;
  for (;;) {
    const size_t newline = c.in.find('\n', c.in_start);
    if (newline == std::string::npos) {
      const auto pending = static_cast<int64_t>(c.in.size() - c.in_start);
      if (!trailers && !c.request_line_read && pending > options_.max_request_line_bytes) {
        return refusal(414, fmt::format("the request line is longer than {} bytes",
                                        options_.max_request_line_bytes));
      }
      if (c.head_bytes + pending > max_header_bytes) {
        return refusal(431, fmt::format("the request's header fields are larger than {} bytes",
                                        max_header_bytes));
      }
      return step(Step::more);
    }
    const auto line_bytes = static_cast<int64_t>(newline + 1 - c.in_start);
    std::string_view line(c.in.data() + c.in_start, newline - c.in_start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    c.head_bytes += line_bytes;
    if (!trailers && !c.request_line_read) {
      if (line_bytes > options_.max_request_line_bytes) {
        return refusal(414, fmt::format("the request line is longer than {} bytes",
                                        options_.max_request_line_bytes));
      }
      if (c.head_bytes > max_header_bytes) {
        return refusal(431, fmt::format("the request's header fields are larger than {} bytes",
                                        max_header_bytes));
      }
      c.in_start = newline + 1;
      if (line.empty()) continue;  // empty lines before a request line are ignored (RFC 9112)
      Step parsed = parse_request_line(c, line);
      if (parsed.kind == Step::refused) return parsed;
      c.request_line_read = true;
      continue;
    }
    if (c.head_bytes > max_header_bytes) {
      return refusal(431, fmt::format("the request's header fields are larger than {} bytes",
                                      max_header_bytes));
    }
    if (line.empty()) {
      c.in_start = newline + 1;
      if (trailers) return step(Step::complete);
      return interpret_head(c);
    }
    if (++c.header_count > options_.max_header_count) {
      return refusal(431, fmt::format("the request has more than {} header fields",
                                      options_.max_header_count));
    }
    if (line.front() == ' ' || line.front() == '\t') {
      return refusal(400, "a header field continued on the next line (obsolete line folding)");
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
      return refusal(400, "a header field line is not NAME: VALUE");
    }
    const std::string_view value = trim_optional_whitespace(line.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char ch) {
          const auto byte = static_cast<unsigned char>(ch);
          return (byte < 0x20 && byte != '\t') || byte == 0x7f;
        })) {
      return refusal(
          400, fmt::format("the header field {} holds a control character", line.substr(0, colon)));
    }
    if (!trailers) {
      c.request.headers.push_back(
          HttpHeader{std::string(line.substr(0, colon)), std::string(value)});
    }
    c.in_start = newline + 1;
  }
}

HttpServer::Loop::Step HttpServer::Loop::parse_request_line(Connection& c, std::string_view line) {
  const size_t first = line.find(' ');
  const size_t last = line.rfind(' ');
  if (first == std::string_view::npos || first == last) {
    return refusal(400, "the request line is not METHOD TARGET HTTP/1.1");
  }
  const std::string_view method = line.substr(0, first);
  const std::string_view target = line.substr(first + 1, last - first - 1);
  const std::string_view version = line.substr(last + 1);
  const bool target_ok = !target.empty() && std::none_of(target.begin(), target.end(), [](char ch) {
    const auto byte = static_cast<unsigned char>(ch);
    return byte <= 0x20 || byte == 0x7f;
  });
  if (!is_token(method) || !target_ok) {
    return refusal(400, "the request line is not METHOD TARGET HTTP/1.1");
  }
  const bool version_form = version.size() == 8 && version.starts_with("HTTP/") &&
                            std::isdigit(static_cast<unsigned char>(version[5])) != 0 &&
                            version[6] == '.' &&
                            std::isdigit(static_cast<unsigned char>(version[7])) != 0;
  if (!version_form) return refusal(400, "the request line is not METHOD TARGET HTTP/1.1");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return refusal(505, fmt::format("{} is not supported; the server speaks HTTP/1.1", version));
  }
  c.request.method = std::string(method);
  c.request.target = std::string(target);
  c.request.minor_version = version[7] - '0';
  return step(Step::progressed);
}

HttpServer::Loop::Step HttpServer::Loop::body_too_large() const {
  return refusal(
      400, options_.body_too_large_message.empty()
               ? fmt::format("the request body is larger than {} bytes", options_.max_body_bytes)
               : options_.body_too_large_message);
}

HttpServer::Loop::Step HttpServer::Loop::interpret_head(Connection& c) {
  HttpRequest& request = c.request;
  request.path = request.target.substr(0, request.target.find('?'));
  c.keep_alive = request.minor_version == 1 && !stopping_;  // HTTP/1.0: closed after
  c.head_only = request.method == "HEAD";
  const int64_t max_body = options_.max_body_bytes;
  bool has_length = false;
  bool length_too_large = false;
  int64_t length = 0;
  std::string transfer_encoding;
  bool has_transfer_encoding = false;
  const std::string* expect = nullptr;
  for (const HttpHeader& field : request.headers) {
    if (equals_ignoring_case(field.name, "Connection")) {
      for (const std::string_view option : comma_list(field.value)) {
        if (equals_ignoring_case(option, "close")) c.keep_alive = false;
      }
    } else if (equals_ignoring_case(field.name, "Transfer-Encoding")) {
      if (has_transfer_encoding) transfer_encoding += ",";
      transfer_encoding += field.value;
      has_transfer_encoding = true;
    } else if (equals_ignoring_case(field.name, "Content-Length")) {
      const std::vector<std::string_view> values = comma_list(field.value);
      if (values.empty()) return refusal(400, "an empty Content-Length");
      for (const std::string_view text : values) {
        int64_t value = 0;
        bool too_large = false;
        for (const char ch : text) {
          if (ch < '0' || ch > '9') {
            return refusal(400, fmt::format("Content-Length '{}' is not a number of bytes", text));
          }
          const int digit = ch - '0';
          // Beyond the limit (which is refused anyway) the value is not kept: no overflow.
          if (too_large || max_body < digit || value > (max_body - digit) / 10) {
            too_large = true;
          } else {
            value = value * 10 + digit;
          }
        }
        if (has_length && (value != length || too_large != length_too_large)) {
          return refusal(400, "the request's Content-Length fields disagree");
        }
        has_length = true;
        length = value;
        length_too_large = too_large;
      }
    } else if (equals_ignoring_case(field.name, "Expect")) {
      expect = &field.value;
    }
  }
  if (has_transfer_encoding) {
    // RFC 9112 §6.1: with both, the length is in doubt (request smuggling): refused.
    if (has_length)
      return refusal(400, "the request has both Transfer-Encoding and Content-Length");
    const std::vector<std::string_view> codings = comma_list(transfer_encoding);
    if (codings.empty() || !equals_ignoring_case(codings.back(), "chunked")) {
      return refusal(400, fmt::format("Transfer-Encoding '{}' does not end in chunked: the body's "
                                      "length is unknown",
                                      transfer_encoding));
    }
    if (codings.size() > 1) {
      return refusal(501, fmt::format("Transfer-Encoding '{}' is not supported; send the body "
                                      "chunked or with a Content-Length",
                                      transfer_encoding));
    }
    c.framing = Framing::chunked;
    c.chunk_part = ChunkPart::size_line;
  } else if (has_length && (length_too_large || length > 0)) {
    if (length_too_large || length > max_body) return body_too_large();
    c.framing = Framing::length;
    c.body_remaining = length;
    request.body.reserve(static_cast<size_t>(std::min<int64_t>(length, 1 << 20)));
  }
  if (expect != nullptr && request.minor_version == 1) {
    if (!equals_ignoring_case(trim_optional_whitespace(*expect), "100-continue")) {
      return refusal(417,
                     fmt::format("Expect: '{}' is not supported; only 100-continue is", *expect));
    }
    // A client that sends its body anyway (some do, after a moment) needs no 100.
    c.send_continue = c.framing != Framing::none && c.in_start == c.in.size();
  }
  if (c.framing == Framing::none) return step(Step::complete);
  c.phase = Phase::body;
  return step(Step::progressed);
}

HttpServer::Loop::Step HttpServer::Loop::parse_body(Connection& c) {
  const int64_t max_body = options_.max_body_bytes;
  std::string& body = c.request.body;
  auto take_data = [&] {
    const auto available = static_cast<int64_t>(c.in.size() - c.in_start);
    const int64_t taken = std::min(c.body_remaining, available);
    body.append(c.in, c.in_start, static_cast<size_t>(taken));
    c.in_start += static_cast<size_t>(taken);
    c.body_remaining -= taken;
  };
  if (c.framing == Framing::length) {
    take_data();
    return step(c.body_remaining == 0 ? Step::complete : Step::more);
  }
  for (;;) {
    switch (c.chunk_part) {
      case ChunkPart::size_line: {
        const size_t newline = c.in.find('\n', c.in_start);
        if (newline == std::string::npos) {
          if (c.in.size() - c.in_start > kMostChunkLineBytes) {
            return refusal(
                400, fmt::format("a chunk-size line is longer than {} bytes", kMostChunkLineBytes));
          }
          return step(Step::more);
        }
        if (newline - c.in_start > kMostChunkLineBytes) {
          return refusal(
              400, fmt::format("a chunk-size line is longer than {} bytes", kMostChunkLineBytes));
        }
        std::string_view line(c.in.data() + c.in_start, newline - c.in_start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        c.in_start = newline + 1;
        int64_t size = 0;
        bool too_large = false;
        size_t digits = 0;
        for (; digits < line.size(); ++digits) {
          const char ch = line[digits];
          int digit = 0;
          if (ch >= '0' && ch <= '9') {
            digit = ch - '0';
          } else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f') {
            digit = (ch | 0x20) - 'a' + 10;
          } else {
            break;
          }
          // Each chunk's bytes count against the limit as it is announced: a chunk that would
          // cross it is refused before it is read (and the hex value never overflows).
          const int64_t room = max_body - static_cast<int64_t>(body.size());
          if (too_large || room < digit || size > (room - digit) / 16) {
            too_large = true;
          } else {
            size = size * 16 + digit;
          }
        }
        const std::string_view rest = trim_optional_whitespace(line.substr(digits));
        if (digits == 0 || (!rest.empty() && rest.front() != ';')) {
          return refusal(400, "a chunk-size line is not a hexadecimal size");
        }
        if (too_large) return body_too_large();
        if (size == 0) {
          c.chunk_part = ChunkPart::trailers;
        } else {
          c.body_remaining = size;
          c.chunk_part = ChunkPart::data;
        }
        continue;
      }
      case ChunkPart::data:
        take_data();
        if (c.body_remaining > 0) return step(Step::more);
        c.chunk_part = ChunkPart::data_end;
        continue;
      case ChunkPart::data_end: {
        const std::string_view rest(c.in.data() + c.in_start, c.in.size() - c.in_start);
        if (rest.empty() || rest == "\r") return step(Step::more);
        if (rest.starts_with("\r\n")) {
          c.in_start += 2;
        } else if (rest.front() == '\n') {
          c.in_start += 1;
        } else {
          return refusal(400, "a chunk's data is not followed by CRLF");
        }
        c.chunk_part = ChunkPart::size_line;
        continue;
      }
      case ChunkPart::trailers:
        // Trailer fields count against the header limits, and are dropped.
        return parse_fields(c, true);
    }
  }
}

bool HttpServer::Loop::dispatch(Connection& c) {
  c.phase = Phase::waiting;
  set_deadline(c, kNoDeadline);
  c.in.erase(0, c.in_start);  // what follows is the next (pipelined) request's
  c.in_start = 0;
  auto exchange = std::make_shared<HttpResponder::Exchange>();
  exchange->core = core_;
  exchange->connection = c.id;
  c.client_gone = exchange->client_gone;
  auto request = std::make_shared<HttpRequest>(std::move(c.request));
  c.request = HttpRequest{};
  request->remote_address = c.remote_address;
  request->remote_port = c.remote_port;
  ++core_->requests;
  core_->post([handler = handler_, request, responder = HttpResponder(std::move(exchange)),
               core = core_.get()] {
    try {
      (*handler)(std::move(*request), responder);
    } catch (const std::exception& error) {
      responder.respond(core->error(500, fmt::format("internal error: {}", error.what())));
    }
  });
  update_interest(c);
  return true;
}

bool HttpServer::Loop::refuse(Connection& c, int status, const std::string& message) {
  ++core_->refusals;
  // Whatever else the client sent is not read: the connection closes after the answer.
  c.keep_alive = false;
  c.send_continue = false;
  c.in.clear();
  c.in.shrink_to_fit();
  c.in_start = 0;
  c.request.body.clear();
  c.request.body.shrink_to_fit();
  return start_response(c, core_->error(status, message));
}

bool HttpServer::Loop::start_response(Connection& c, const HttpResponse& response) {
  if (c.out_written == c.out.size()) {
    c.out.clear();
    c.out_written = 0;
  }
  if (stopping_) c.keep_alive = false;
  c.out += serialize(response, c.keep_alive, c.head_only);
  c.phase = Phase::writing;
  set_deadline(c, now() + options_.write_timeout);
  return flush(c);
}

bool HttpServer::Loop::flush(Connection& c) {
  while (c.out_written < c.out.size()) {
    const ssize_t sent =
        send(c.fd, c.out.data() + c.out_written, c.out.size() - c.out_written, MSG_NOSIGNAL);
    if (sent > 0) {
      c.out_written += static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      update_interest(c);
      return true;
    }
    close_connection(c);
    return false;
  }
  c.out.clear();
  c.out_written = 0;
  if (c.phase == Phase::writing) return finish_response(c);
  update_interest(c);
  return true;
}

bool HttpServer::Loop::finish_response(Connection& c) {
  c.request = HttpRequest{};
  c.head_only = false;
  if (c.keep_alive && !stopping_) {
    c.phase = Phase::idle;
    set_deadline(c, now() + options_.idle_timeout);
    // A pipelined request may be here already.
    if (!process_input(c)) return false;
    update_interest(c);
    return true;
  }
  if (c.peer_closed || stopping_) {
    close_connection(c);
    return false;
  }
  // A lingering close: the client may still be sending what the server will not read, and a
  // close with unread bytes would answer them with a reset that can destroy the response before
  // the client reads it.
  shutdown(c.fd, SHUT_WR);
  c.phase = Phase::lingering;
  c.in.clear();
  c.in.shrink_to_fit();
  c.in_start = 0;
  set_deadline(c, now() + options_.linger_timeout);
  update_interest(c);
  return true;
}

bool HttpServer::Loop::drain(Connection& c) {
  std::array<char, kReadChunk> buffer{};
  for (size_t total = 0; total < kMostReadPerEvent;) {
    const ssize_t received = recv(c.fd, buffer.data(), buffer.size(), 0);
    if (received > 0) {
      total += static_cast<size_t>(received);
      continue;
    }
    if (received < 0 && errno == EINTR) continue;
    if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_connection(c);  // the client's FIN, or an error: done
    return false;
  }
  return true;
}

// ---- the server

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : core_(std::make_shared<Core>()) {
  core_->error_response = options.error_response;
  loop_ = std::make_unique<Loop>(std::move(options), std::move(handler), core_);
}

HttpServer::~HttpServer() {
  loop_.reset();
}

int HttpServer::port() const {
  return loop_->port();
}

void HttpServer::run() {
  loop_->run();
}

void HttpServer::stop() {
  {
    std::lock_guard lock(core_->mutex);
    core_->stop_requested = true;
  }
  core_->wake_loop();
}

HttpServerStatistics HttpServer::statistics() const {
  return HttpServerStatistics{.connections_accepted = core_->connections_accepted.load(),
                              .connections_refused = core_->connections_refused.load(),
                              .requests = core_->requests.load(),
                              .refusals = core_->refusals.load(),
                              .timeouts = core_->timeouts.load(),
                              .most_buffered_bytes = core_->most_buffered_bytes.load()};
}

}  // namespace backend
