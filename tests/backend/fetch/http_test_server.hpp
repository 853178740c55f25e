// A small HTTP/1.1 file server for the download tests, on 127.0.0.1 at a free port, in threads
// of the test process. Python's http.server cannot serve byte ranges, and the tests need to
// misbehave on purpose, so this one does exactly what they ask, per path:
//  - serves registered files, with `Range: bytes=N-` → 206 and `Content-Range: bytes N-M/L`
//    (N ≥ L → 416 with `Content-Range: bytes */L`), as RFC 9110 §14 describes; unknown paths
//    → 404 with a short text body;
//  - answers a status (e.g. 503, with an optional Retry-After) to the first k requests;
//  - cuts the connection after sending part of a body (Content-Length promises all of it);
//  - stalls mid-body for a while before closing;
//  - ignores Range headers (always 200 with the whole file).
// Every request is recorded (path, Range header, arrival time) for the tests to inspect.
// Header-only because tests/CMakeLists.txt compiles only *_test.cpp files.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace test_support {

class HttpTestServer {
 public:
  struct Request {
    std::string path;
    std::string range;  // the Range header's value, empty when absent
    std::chrono::steady_clock::time_point arrived;
  };

  struct Behaviour {
    std::string content;
    int fail_count = 0;            // the first fail_count requests get fail_status
    int fail_status = 503;
    int retry_after_seconds = -1;  // sent with the failures when ≥ 0
    int cut_count = 0;             // the next cut_count body responses stop after cut_after bytes
    size_t cut_after = 0;
    int stall_count = 0;           // the next stall_count body responses stop after stall_after
    size_t stall_after = 0;        // bytes and then wait stall_seconds before closing
    double stall_seconds = 0;
    bool ignore_range = false;
  };

  HttpTestServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0) throw std::runtime_error("socket failed");
    const int yes = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 16) != 0) {
      throw std::runtime_error("bind/listen on 127.0.0.1 failed");
    }
    socklen_t length = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~HttpTestServer() {
    stopping_ = true;
    acceptor_.join();
    for (auto& connection : connections_) connection.join();
    ::close(listener_);
  }

  HttpTestServer(const HttpTestServer&) = delete;
  HttpTestServer& operator=(const HttpTestServer&) = delete;

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

  // Registers (or replaces) what `path` serves and how.
  void serve(const std::string& path, Behaviour behaviour) {
    std::lock_guard lock(mutex_);
    files_[path] = std::move(behaviour);
  }

  std::vector<Request> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  void accept_loop() {
    while (!stopping_) {
      pollfd poll_fd{listener_, POLLIN, 0};
      if (::poll(&poll_fd, 1, 50) <= 0) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      connections_.emplace_back([this, client] {
        handle(client);
        ::close(client);
      });
    }
  }

  static bool send_all(int fd, const char* data, size_t size) {
    while (size > 0) {
      const ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
      if (sent <= 0) return false;
      data += sent;
      size -= static_cast<size_t>(sent);
    }
    return true;
  }

  static std::string status_text(int status) {
    switch (status) {
      case 200: return "200 OK";
      case 206: return "206 Partial Content";
      case 404: return "404 Not Found";
      case 416: return "416 Range Not Satisfiable";
      case 429: return "429 Too Many Requests";
      case 500: return "500 Internal Server Error";
      case 503: return "503 Service Unavailable";
      default: return std::to_string(status) + " Status";
    }
  }

  void handle(int client) {
    std::string head;
    char buffer[4096];
    while (head.find("\r\n\r\n") == std::string::npos) {
      pollfd poll_fd{client, POLLIN, 0};
      if (::poll(&poll_fd, 1, 2000) <= 0) return;
      const ssize_t got = ::recv(client, buffer, sizeof buffer, 0);
      if (got <= 0) return;
      head.append(buffer, static_cast<size_t>(got));
    }
    const size_t first_space = head.find(' ');
    const std::string path = head.substr(first_space + 1, head.find(' ', first_space + 1) - first_space - 1);
    std::string range;
    for (size_t at = head.find("\r\n"); at != std::string::npos && at + 2 < head.size();
         at = head.find("\r\n", at + 2)) {
      const std::string line = head.substr(at + 2, head.find("\r\n", at + 2) - at - 2);
      if (line.size() > 6 && (line.compare(0, 6, "Range:") == 0 || line.compare(0, 6, "range:") == 0)) {
        range = line.substr(line.find_first_not_of(' ', 6));
      }
    }
    Behaviour behaviour;
    bool known = false;
    bool failing = false, cutting = false, stalling = false;
    {
      std::lock_guard lock(mutex_);
      requests_.push_back({path, range, std::chrono::steady_clock::now()});
      auto found = files_.find(path);
      if (found != files_.end()) {
        known = true;
        Behaviour& stored = found->second;
        if (stored.fail_count > 0) {
          --stored.fail_count;
          failing = true;
        } else if (stored.cut_count > 0) {
          --stored.cut_count;
          cutting = true;
        } else if (stored.stall_count > 0) {
          --stored.stall_count;
          stalling = true;
        }
        behaviour = stored;
      }
    }
    if (!known || failing) {
      const int status = known ? behaviour.fail_status : 404;
      const std::string body = known ? "try again later\n" : "no such file: " + path + "\n";
      std::string response = "HTTP/1.1 " + status_text(status) + "\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\nConnection: close\r\n";
      if (known && behaviour.retry_after_seconds >= 0) {
        response += "Retry-After: " + std::to_string(behaviour.retry_after_seconds) + "\r\n";
      }
      response += "\r\n" + body;
      send_all(client, response.data(), response.size());
      return;
    }
    const std::string& content = behaviour.content;
    size_t start = 0;
    if (!range.empty() && !behaviour.ignore_range && range.rfind("bytes=", 0) == 0) {
      start = std::stoull(range.substr(6));
      if (start >= content.size()) {
        const std::string response = "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */" +
                                     std::to_string(content.size()) +
                                     "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(client, response.data(), response.size());
        return;
      }
    }
    const bool partial = start > 0;
    std::string response = "HTTP/1.1 " + status_text(partial ? 206 : 200) +
                           "\r\nContent-Length: " + std::to_string(content.size() - start) +
                           "\r\nAccept-Ranges: bytes\r\nConnection: close\r\n";
    if (partial) {
      response += "Content-Range: bytes " + std::to_string(start) + "-" +
                  std::to_string(content.size() - 1) + "/" + std::to_string(content.size()) + "\r\n";
    }
    response += "\r\n";
    if (!send_all(client, response.data(), response.size())) return;
    size_t end = content.size();
    if (cutting) end = std::min(end, start + behaviour.cut_after);
    if (stalling) end = std::min(end, start + behaviour.stall_after);
    if (!send_all(client, content.data() + start, end - start)) return;
    if (stalling) {
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(behaviour.stall_seconds));
      while (!stopping_ && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    // Falling out closes the connection: a cut or stalled body ends short of Content-Length.
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // touched by the acceptor only, joined after it
  mutable std::mutex mutex_;
  std::map<std::string, Behaviour> files_;
  std::vector<Request> requests_;
};

}  // namespace test_support
