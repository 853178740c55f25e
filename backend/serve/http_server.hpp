// A small HTTP/1.1 server (RFC 9112's message syntax: request line, header fields, a body by
// Content-Length or chunked transfer coding; keep-alive, pipelining, `Expect: 100-continue`)
// for text_generation_server, where every resource a client can take is bounded:
//   - one event-loop thread (Linux epoll, non-blocking sockets) reads and writes every
//     connection, so a slow client holds only its connection's buffers, never a thread;
//   - the request line and header fields (and a chunked body's trailer fields) are bounded in
//     bytes and in count (414, 431), the body in bytes however it is framed: a Content-Length
//     over the limit is refused before a byte of the body is read, a chunked body as soon as
//     the chunk that crosses it is announced (400);
//   - one deadline per request, from its first byte until its last, whatever the pace of the
//     bytes in between (408), one for writing a response, and one for an idle keep-alive
//     connection;
//   - at most max_connections open connections: the next one is answered 503 and closed;
//   - the listen backlog is SOMAXCONN (the kernel caps it at net.core.somaxconn), not a
//     handful, so that a burst of connections waits in the kernel rather than being dropped.
// A complete request goes to the handler on one of a few handler threads; the handler answers
// through an HttpResponder, at once or later from any thread (the text generation server answers
// when its scheduler is done). While a request waits for its answer the loop watches its client:
// a client that closes its connection (or shuts down its sending side, as nginx reads it) has
// the responder's client_gone() token stopped. Errors the server answers itself close the
// connection after the response, with a lingering close (the write side shut down, then the
// client's further bytes read and dropped for at most a moment) so that a client still sending
// reads the response rather than a reset, as nginx and Apache do.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace backend {

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpRequest {
  std::string method;
  std::string target;     // as sent: the path and the query
  std::string path;       // the target up to its '?'
  int minor_version = 1;  // HTTP/1.minor_version
  std::vector<HttpHeader> headers;
  std::string body;
  std::string remote_address;  // numeric, as getnameinfo(NI_NUMERICHOST) writes it
  int remote_port = 0;

  // The value of the first header field of this name (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;         // the Content-Type field, when not empty
  std::vector<HttpHeader> headers;  // others; the server writes Content-Length and Connection
  std::string body;
};

// What the server answers on its own (a malformed or oversized request, a timeout, too many
// connections) and when a handler gives no response: status and message to a response.
using HttpErrorResponse = std::function<HttpResponse(int status, const std::string& message)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // a name or a numeric address, IPv4 or IPv6
  int port = 0;                    // 0: any free port (port() says which)
  int64_t max_body_bytes = 16 << 20;
  // The message of the 400 for a body over max_body_bytes; empty: "the request body is larger
  // than N bytes".
  std::string body_too_large_message;
  int64_t max_request_line_bytes = 8 << 10;  // beyond: 414
  int64_t max_header_bytes = 64 << 10;       // the request line and all header fields; beyond: 431
  int64_t max_header_count = 100;            // header fields (and trailer fields); beyond: 431
  // From a request's first byte to its last (headers and body); beyond: 408 and closed.
  std::chrono::milliseconds request_timeout{10'000};
  // Writing one response, whole; beyond: closed.
  std::chrono::milliseconds write_timeout{10'000};
  // A connection waiting for its first or next request; beyond: closed.
  std::chrono::milliseconds idle_timeout{2'000};
  // How long a closing connection reads and drops what its client still sends.
  std::chrono::milliseconds linger_timeout{2'000};
  int64_t max_connections = 1024;  // open at once; beyond: 503 and closed
  int handler_threads = 4;
  HttpErrorResponse error_response;  // empty: text/plain with the message
};

struct HttpServerStatistics {
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;  // over max_connections
  int64_t requests = 0;             // handed to the handler
  int64_t refusals = 0;             // answered by the server itself (4xx, 5xx)
  int64_t timeouts = 0;             // requests or responses cut at their deadline
  int64_t most_buffered_bytes = 0;  // the most bytes of one request held at once
};

// Answers one request, once: the first respond() counts, later ones are dropped. Copies share
// the request. If every copy is destroyed without an answer, the client gets a 500.
class HttpResponder {
 public:
  struct Exchange;  // the server's record of the request (http_server.cpp)
  explicit HttpResponder(std::shared_ptr<Exchange> exchange) : exchange_(std::move(exchange)) {}

  // From any thread.
  void respond(HttpResponse response) const;
  // Makes the response on one of the server's handler threads: for work too slow for the
  // caller's thread (a scheduler's worker). From any thread.
  void respond_with(std::function<HttpResponse()> make) const;
  // Stopped once the client has closed its connection (or shut down its sending side), or the
  // server has closed it: nobody will read the answer.
  std::stop_token client_gone() const;

 private:
  std::shared_ptr<Exchange> exchange_;
};

// Called on a handler thread for each complete request; answers through the responder, now or
// later. An exception it throws answers 500.
using HttpHandler = std::function<void(HttpRequest request, HttpResponder responder)>;

class HttpServer {
 public:
  // Listens on options.host:options.port (backlog SOMAXCONN) and starts the handler threads;
  // common::Error when it cannot (the address, the port in use, no thread).
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stop(), and the handler threads joined
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // The event loop, on the caller's thread, until stop(): then it stops accepting, closes the
  // connections that have no request waiting for its answer, writes the answers still to come
  // (with Connection: close) and returns, after write_timeout at the latest.
  void run();
  // From any thread (not from a signal handler); before run() too.
  void stop();
  HttpServerStatistics statistics() const;

  struct Core;  // what the loop shares with the handler threads and responders

 private:
  class Loop;
  std::shared_ptr<Core> core_;
  std::unique_ptr<Loop> loop_;
};

// The reason phrase of a status code ("Not Found"), "Unknown" for one this server never sends.
std::string_view http_reason_phrase(int status);

}  // namespace backend
