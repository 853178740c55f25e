// HttpServer (http_server.hpp) over real loopback sockets, with a handler that echoes what it
// was given: keep-alive, pipelining, chunked bodies, `Expect: 100-continue`, HTTP/1.0 and HEAD;
// and the bounds: a body over the limit (by Content-Length, or chunked) is refused with 400
// before it is read and never reaches the handler; a header flood is answered 431 while the
// server holds no more than the header limit of it; 20 clients that trickle one byte at a time
// are cut at the request deadline while a request on another connection is answered at once;
// connections beyond the limit get 503; a client that closes while its request waits has it
// stopped; a client that does not read is cut at the write deadline; stop() writes the answers
// still to come and returns.
#include "backend/serve/http_server.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace backend;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A server on a free loopback port, its loop on a thread of its own. The handler answers
// "METHOD TARGET BODY-BYTES BODY" unless the test gives one.
class TestServer {
 public:
  explicit TestServer(HttpServerOptions options, HttpHandler handler = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    if (!handler) {
      handler = [this](HttpRequest request, HttpResponder responder) {
        ++calls;
        responder.respond(HttpResponse{.status = 200,
                                       .content_type = "text/plain",
                                       .headers = {},
                                       .body = request.method + " " + request.target + " " +
                                               std::to_string(request.body.size()) + " " +
                                               request.body});
      };
    }
    server_.emplace(std::move(options), std::move(handler));
    loop_ = std::thread([this] { server_->run(); });
  }
  ~TestServer() { stop(); }
  void stop() {
    if (!loop_.joinable()) return;
    server_->stop();
    loop_.join();
  }
  int port() const { return server_->port(); }
  HttpServerStatistics statistics() const { return server_->statistics(); }

  std::atomic<int> calls = 0;

 private:
  std::optional<HttpServer> server_;
  std::thread loop_;
};

// A TCP connection to the server; closed with the object.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { close(fd_); }
  int fd() const { return fd_; }

  // False once the server has closed or reset the connection.
  bool send_text(const std::string& text) const {
    size_t sent = 0;
    while (sent < text.size()) {
      const ssize_t done = send(fd_, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
      if (done <= 0) return false;
      sent += static_cast<size_t>(done);
    }
    return true;
  }

  // Bytes until `text` has arrived, the connection ends or `timeout` passes.
  std::string read_until(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (received_.find(text) == std::string::npos && !ended_) {
      if (!read_some(deadline)) break;
    }
    return received_;
  }
  // One response: status, the head and the body (by Content-Length); nullopt when none came
  // whole within `timeout`.
  struct Response {
    int status = 0;
    std::string head;
    std::string body;
  };
  std::optional<Response> read_response(std::chrono::milliseconds timeout = 5000ms,
                                        bool to_head = false) {
    const auto deadline = Clock::now() + timeout;
    size_t head_end = std::string::npos;
    while ((head_end = received_.find("\r\n\r\n")) == std::string::npos) {
      if (ended_ || !read_some(deadline)) return std::nullopt;
    }
    Response response;
    response.head = received_.substr(0, head_end + 2);
    response.status = std::stoi(response.head.substr(9, 3));
    size_t length = 0;
    const size_t field = response.head.find("Content-Length: ");
    if (field != std::string::npos) length = std::stoul(response.head.substr(field + 16));
    if (response.status == 100 || to_head) length = 0;
    while (received_.size() < head_end + 4 + length) {
      if (ended_ || !read_some(deadline)) return std::nullopt;
    }
    response.body = received_.substr(head_end + 4, length);
    received_.erase(0, head_end + 4 + length);
    return response;
  }
  // True once the server has closed the connection (EOF or reset), within `timeout`.
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!ended_) {
      if (!read_some(deadline)) return ended_;
    }
    return true;
  }
  bool ended() const { return ended_; }

 private:
  // False on timeout.
  bool read_some(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd watched{.fd = fd_, .events = POLLIN, .revents = 0};
    if (poll(&watched, 1, static_cast<int>(left)) <= 0) return false;
    char buffer[65536];
    const ssize_t got = recv(fd_, buffer, sizeof buffer, 0);
    if (got <= 0) {
      ended_ = true;
      return true;
    }
    received_.append(buffer, static_cast<size_t>(got));
    return true;
  }

  int fd_ = -1;
  std::string received_;
  bool ended_ = false;
};

std::string put(const std::string& target, const std::string& body) {
  return "PUT " + target +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// Sends `total` bytes of a body (after `head`) from a thread of its own until they are sent or
// the server ends the connection; `sent` says how far it came.
class Sender {
 public:
  Sender(Client& client, std::string head, size_t total, bool chunked)
      : thread_([this, &client, head = std::move(head), total, chunked] {
          if (!client.send_text(head)) return;
          const std::string piece(4096, 'x');
          char size_line[32];
          std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
          const std::string chunk = std::string(size_line) + piece + "\r\n";
          while (sent < total && !stop) {
            if (!client.send_text(chunked ? chunk : piece)) return;
            sent += piece.size();
          }
        }) {}
  ~Sender() { thread_.join(); }
  std::atomic<size_t> sent = 0;
  std::atomic<bool> stop = false;

 private:
  std::thread thread_;
};

}  // namespace

TEST_CASE("keep-alive, pipelined requests, chunked bodies, Expect: 100-continue, HTTP/1.0, HEAD") {
  TestServer server({});
  Client client(server.port());
  // Two requests in one write: two answers, in order, on the same connection.
  REQUIRE(client.send_text(put("/a?x=1", "abc") + "GET /b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  auto first = client.read_response();
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->body == "PUT /a?x=1 3 abc");
  CHECK(first->head.find("Connection: close") == std::string::npos);
  auto second = client.read_response();
  REQUIRE(second);
  CHECK(second->body == "GET /b 0 ");
  // Chunked, with a chunk extension, upper-case hex, a bare-LF line and a trailer field.
  REQUIRE(
      client.send_text("PUT /c HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3;name=value\r\nabc\r\nA\r\n0123456789\n0\r\nX-Trailer: t\r\n\r\n"));
  auto chunked = client.read_response();
  REQUIRE(chunked);
  CHECK(chunked->body == "PUT /c 13 abc0123456789");
  // Expect: 100-continue: the 100 comes before the body is sent.
  REQUIRE(
      client.send_text("PUT /d HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                       "Content-Length: 5\r\n\r\n"));
  auto proceed = client.read_response();
  REQUIRE(proceed);
  CHECK(proceed->status == 100);
  REQUIRE(client.send_text("hello"));
  auto continued = client.read_response();
  REQUIRE(continued);
  CHECK(continued->body == "PUT /d 5 hello");
  // HEAD: the length of the body, not the body.
  REQUIRE(client.send_text("HEAD /e HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + put("/f", "")));
  auto head = client.read_response(5000ms, true);
  REQUIRE(head);
  CHECK(head->head.find("Content-Length: 10") != std::string::npos);  // "HEAD /e 0 "
  auto after_head = client.read_response();
  REQUIRE(after_head);
  CHECK(after_head->body == "PUT /f 0 ");
  CHECK(server.calls == 6);

  // HTTP/1.0, and Connection: close: closed after the answer.
  for (const std::string& request : {std::string("GET /g HTTP/1.0\r\n\r\n"),
                                     std::string("GET /h HTTP/1.1\r\nConnection: close\r\n\r\n")}) {
    CAPTURE(request);
    Client once(server.port());
    REQUIRE(once.send_text(request));
    auto answer = once.read_response();
    REQUIRE(answer);
    CHECK(answer->status == 200);
    CHECK(answer->head.find("Connection: close") != std::string::npos);
    CHECK(once.closed_within(2000ms));
  }
  // Malformed requests: 400 (or 505, 501) from the server, never the handler.
  const int calls = server.calls;
  // Named members, not a structured binding: clang 14 cannot capture one in doctest's CAPTURE.
  for (const auto& malformed : std::vector<std::pair<std::string, int>>{
           {"PUT /x\r\n\r\n", 400},
           {"PUT /x HTTP/2.0\r\n\r\n", 505},
           {"PUT /x HTTP/1.1\r\nBad Name: 1\r\n\r\n", 400},
           {"PUT /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400},
           {"PUT /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
           {"PUT /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
           {"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
           {"PUT /x HTTP/1.1\r\nExpect: nothing\r\nContent-Length: 1\r\n\r\n", 417}}) {
    const std::string& request = malformed.first;
    CAPTURE(request);
    Client bad(server.port());
    REQUIRE(bad.send_text(request));
    auto answer = bad.read_response();
    REQUIRE(answer);
    CHECK(answer->status == malformed.second);
    CHECK(bad.closed_within(3000ms));
  }
  CHECK(server.calls == calls);
}

TEST_CASE("a body over the limit is refused with 400 before it is read, chunked or not") {
  HttpServerOptions options;
  options.max_body_bytes = 64 << 10;
  options.body_too_large_message = "the request body is larger than --max-request-bytes 65536";
  options.linger_timeout = 300ms;
  TestServer server(options);
  constexpr size_t kTotal = 64 << 20;
  SUBCASE("chunked") {
    Client client(server.port());
    Sender sender(client,
                  "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                  kTotal, true);
    auto answer = client.read_response();
    sender.stop = true;
    shutdown(client.fd(), SHUT_RDWR);
    REQUIRE(answer);
    CHECK(answer->status == 400);
    CHECK(answer->body == "the request body is larger than --max-request-bytes 65536\n");
  }
  SUBCASE("by Content-Length, with Expect: 100-continue: no 100, and not a byte of it read") {
    Client client(server.port());
    REQUIRE(
        client.send_text("PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                         "Content-Length: 100000000\r\n\r\n"));
    auto answer = client.read_response();
    REQUIRE(answer);
    CHECK(answer->status == 400);
    CHECK(client.closed_within(2000ms));
  }
  SUBCASE("a chunk size beyond any integer") {
    Client client(server.port());
    REQUIRE(
        client.send_text("PUT /api HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "ffffffffffffffffffffffffffffffff\r\n"));
    auto answer = client.read_response();
    REQUIRE(answer);
    CHECK(answer->status == 400);
    CHECK(answer->body.find("larger than --max-request-bytes") != std::string::npos);
  }
  CHECK(server.calls == 0);
  // What one request held: the limit and a read's worth, not the 64 MiB.
  CHECK(server.statistics().most_buffered_bytes <= (64 << 10) + (32 << 10));
  // And a body at the limit is taken.
  Client client(server.port());
  REQUIRE(client.send_text(put("/api", std::string(64 << 10, 'y'))));
  auto answer = client.read_response();
  REQUIRE(answer);
  CHECK(answer->status == 200);
}

TEST_CASE("a header flood is answered 431, and the server holds no more than the limit of it") {
  HttpServerOptions options;
  options.linger_timeout = 300ms;
  TestServer server(options);
  {
    // A million header fields, 17 MB.
    std::string flood = "PUT /api HTTP/1.1\r\n";
    flood.reserve(18 << 20);
    for (int i = 0; i < 1'000'000; ++i) {
      flood += "X-Flood: " + std::to_string(1'000'000 + i) + "\r\n";
    }
    Client client(server.port());
    std::thread sender([&] { client.send_text(flood); });
    auto answer = client.read_response();
    shutdown(client.fd(), SHUT_RDWR);
    sender.join();
    REQUIRE(answer);
    CHECK(answer->status == 431);
    CHECK(answer->body.find("more than 100 header fields") != std::string::npos);
  }
  // Fewer fields, but larger: 40 of 4 KiB; and one field of 1 MiB, refused before its end.
  std::string forty_large;
  for (int i = 0; i < 40; ++i) {
    forty_large += "X-Large-" + std::to_string(i) + ": " + std::string(4096, 'v') + "\r\n";
  }
  for (const std::string& fields : {forty_large + "\r\n", "X-Huge: " + std::string(1 << 20, 'v')}) {
    Client client(server.port());
    std::thread sender([&] { client.send_text("PUT /api HTTP/1.1\r\n" + fields); });
    auto answer = client.read_response();
    shutdown(client.fd(), SHUT_RDWR);
    sender.join();
    REQUIRE(answer);
    CHECK(answer->status == 431);
    CHECK(answer->body.find("larger than 65536 bytes") != std::string::npos);
  }
  CHECK(server.statistics().most_buffered_bytes <= (64 << 10) + (32 << 10));
  {
    Client client(server.port());
    REQUIRE(client.send_text("GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n\r\n"));
    auto answer = client.read_response();
    REQUIRE(answer);
    CHECK(answer->status == 414);
  }
  CHECK(server.calls == 0);
}

TEST_CASE("clients that trickle their requests are cut at the deadline, and hold up nobody") {
  HttpServerOptions options;
  options.request_timeout = 600ms;
  TestServer server(options);
  const std::string request = put("/slow", "{}");
  std::vector<std::unique_ptr<Client>> tricklers;
  for (int i = 0; i < 20; ++i) tricklers.push_back(std::make_unique<Client>(server.port()));
  const auto start = Clock::now();
  std::atomic<bool> done = false;
  // One byte per client every 100 ms: every read of the server's gets a byte in time, but the
  // request would take 4 s to arrive.
  std::thread trickle([&] {
    for (size_t at = 0; at < request.size() && !done; ++at) {
      for (auto& client : tricklers) client->send_text(request.substr(at, 1));
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(150ms);
  // Meanwhile a whole request is answered at once.
  const auto asked = Clock::now();
  Client normal(server.port());
  REQUIRE(normal.send_text(put("/fast", "hi")));
  auto answer = normal.read_response();
  const double answered_after = seconds_since(asked);
  REQUIRE(answer);
  CHECK(answer->status == 200);
  CHECK(answered_after < 0.3);
  // Each trickler is answered 408 and closed at its deadline.
  for (auto& client : tricklers) {
    auto cut = client->read_response(3000ms);
    REQUIRE(cut);
    CHECK(cut->status == 408);
    CHECK(client->closed_within(2000ms));
  }
  const double cut_after = seconds_since(start);
  done = true;
  trickle.join();
  CHECK(cut_after >= 0.55);
  CHECK(cut_after < 2.5);
  CHECK(server.statistics().timeouts >= 20);
  CHECK(server.calls == 1);
}

TEST_CASE("connections beyond the limit are answered 503 and closed, and idle ones time out") {
  HttpServerOptions options;
  options.max_connections = 4;
  options.idle_timeout = 800ms;
  TestServer server(options);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<Client>(server.port()));
  std::this_thread::sleep_for(100ms);  // accepted
  Client extra(server.port());
  auto refused = extra.read_response();
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(refused->body.find("4 connections open") != std::string::npos);
  CHECK(extra.closed_within(1000ms));
  CHECK(server.statistics().connections_refused == 1);
  // The idle ones are closed after idle_timeout, and new clients are served again.
  for (auto& client : held) CHECK(client->closed_within(2000ms));
  Client later(server.port());
  REQUIRE(later.send_text(put("/api", "x")));
  auto answer = later.read_response();
  REQUIRE(answer);
  CHECK(answer->status == 200);
}

TEST_CASE("a client that closes while its request waits has it stopped and stop() answers the rest") {
  std::mutex mutex;
  std::vector<HttpResponder> waiting;
  HttpServerOptions options;
  TestServer server(options, [&](HttpRequest, HttpResponder responder) {
    std::lock_guard lock(mutex);
    waiting.push_back(responder);
  });
  auto waiting_count = [&] {
    std::lock_guard lock(mutex);
    return waiting.size();
  };
  {
    Client leaving(server.port());
    REQUIRE(leaving.send_text(put("/api", "{}")));
    for (int i = 0; i < 200 && waiting_count() < 1; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(waiting_count() == 1);
    CHECK_FALSE(waiting[0].client_gone().stop_requested());
  }
  bool stopped = false;
  for (int i = 0; i < 200 && !stopped; ++i) {
    stopped = waiting[0].client_gone().stop_requested();
    if (!stopped) std::this_thread::sleep_for(10ms);
  }
  CHECK(stopped);

  // A request waiting when the server stops gets its answer, then the connection closes.
  Client staying(server.port());
  REQUIRE(staying.send_text(put("/api", "{}")));
  for (int i = 0; i < 200 && waiting_count() < 2; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(waiting_count() == 2);
  std::thread stopper([&] { server.stop(); });
  std::this_thread::sleep_for(100ms);
  waiting[1].respond(HttpResponse{
      .status = 503, .content_type = "text/plain", .headers = {}, .body = "shutting down"});
  stopper.join();
  auto answer = staying.read_response();
  REQUIRE(answer);
  CHECK(answer->status == 503);
  CHECK(answer->head.find("Connection: close") != std::string::npos);
  CHECK(staying.closed_within(1000ms));
}

TEST_CASE("a client that does not read its response is cut at the write deadline") {
  HttpServerOptions options;
  options.write_timeout = 500ms;
  TestServer server(options, [](HttpRequest, HttpResponder responder) {
    responder.respond(HttpResponse{.status = 200,
                                   .content_type = "text/plain",
                                   .headers = {},
                                   .body = std::string(32 << 20, 'z')});
  });
  Client client(server.port());
  const int small = 4096;
  setsockopt(client.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  REQUIRE(client.send_text(put("/api", "")));
  const auto start = Clock::now();
  while (server.statistics().timeouts == 0 && seconds_since(start) < 3) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(server.statistics().timeouts == 1);
  CHECK(seconds_since(start) < 2.0);
}

TEST_CASE("a handler that throws, or answers nobody, gets its client a 500") {
  HttpServerOptions options;
  TestServer server(options, [](HttpRequest request, HttpResponder responder) {
    if (request.path == "/throw") throw std::runtime_error("broken");
    (void)responder;  // dropped without an answer
  });
  for (const std::string target : {"/throw", "/drop"}) {
    CAPTURE(target);
    Client client(server.port());
    REQUIRE(client.send_text(put(target, "")));
    auto answer = client.read_response();
    REQUIRE(answer);
    CHECK(answer->status == 500);
  }
}
