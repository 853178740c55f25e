// text_generation_server and text_generation_cli, the executables, on a tiny GPT that
// pretrain_gpt trains here (GPT-2's tokenizer, three LAMBADA passages): PUT /api with every
// request field answers Megatron's response, whose greedy text, segments and logprobs are those
// of generate() over full forwards of the same checkpoint loaded in this test (the KV-cache
// decoder must agree with the full forward); bad requests get 400 and a message and the server
// serves on; 16 concurrent clients get their serial answers while a client that sent half a
// request stalls; a client that sends a long request and closes its connection has its
// request stopped (its slot freed, a 499 in the log); SIGTERM ends it with exit 0 promptly; the
// CLI drives it from standard input; `hey` puts 160 requests through 16 connections, all
// answered 200; a chunked body over --max-request-bytes is refused with 400 and a header flood
// with 431; a request is answered within a second while 80 clients trickle theirs a byte at a
// time (and are cut at --socket-timeout); and --max-concurrent-requests 100000000 is refused
// with exit 2 before the server serves.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/data/tokenizer.hpp"
#include "backend/serve/generation.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trained_model.hpp"
#include "backend/train/trainer.hpp"
#include "bounded_run.hpp"
#include "generation_server_process.hpp"
#include "launcher/process.hpp"
#include "spawned_process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tests/reference_tools.hpp"
#include "tiny_lambada_checkpoint.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using test_support::tiny_lambada_model_flags;

using test_support::kTestBin;

using test_support::join;

// The tiny checkpoint (trained once per build), and this process's directory for the servers'
// logs and the tests' files.
const test_support::SharedTinyLambadaCheckpoint& checkpoint() {
  static const test_support::SharedTinyLambadaCheckpoint trained =
      test_support::shared_tiny_lambada_checkpoint(30);
  INFO(trained.output);
  REQUIRE(trained.ok);
  return trained;
}

const fs::path& scratch() {
  static const test_support::TemporaryDirectory directory("text_generation_server");
  return directory.path;
}

// A running server on the test's checkpoint, with `flags` added.
class Server : public test_support::GenerationServerProcess {
 public:
  explicit Server(const std::vector<std::string>& flags = {})
      : GenerationServerProcess(
            join(join(join({kTestBin + "/text_generation_server"}, tiny_lambada_model_flags()),
                      {"--load", checkpoint().checkpoints.string()}),
                 flags),
            scratch() / ("server_" + std::to_string(++count_) + ".log")) {}
  std::string log() const { return log_text(); }

 private:
  static inline int count_ = 0;
};

// generate() over full forwards of the checkpoint, in this process: the reference.
struct Reference {
  std::unique_ptr<backend::Tokenizer> tokenizer;
  backend::SelectedDevice selected;
  std::optional<backend::GptModel<float>> model;

  Reference() {
    const std::vector<std::string> words =
        join(join({"text_generation_server"}, tiny_lambada_model_flags()),
             {"--load", checkpoint().checkpoints.string()});
    std::vector<const char*> argv;
    for (const auto& word : words) argv.push_back(word.c_str());
    const auto arguments = backend::parse_arguments(
        static_cast<int>(argv.size()), argv.data(),
        backend::ArgumentsProgram::text_generation_server);
    REQUIRE(arguments);
    tokenizer = backend::build_tokenizer(arguments->tokenizer);
    selected = backend::select_device(*arguments);
    model.emplace(backend::load_trained_model(*arguments, selected, "test"));
  }
  backend::GenerationResult generate(const std::string& prompt,
                                     const backend::GenerateRequest& request, uint64_t index) {
    return backend::generate(*model, *tokenizer, prompt, request, {.prompt_index = index});
  }
};

// `count` words of one GPT-2 token each.
std::string words(int count) {
  std::string text = "the";
  for (int i = 1; i < count; ++i) text += " the";
  return text;
}

// A TCP connection to the server, for requests written by hand.
int connection_to(int port) {
  const int socket_fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(socket_fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(socket_fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  return socket_fd;
}

// Half a request, then silence: the connection stays open.
int stalled_connection(int port) {
  const int socket_fd = connection_to(port);
  const std::string half =
      "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 200\r\n\r\n{\"prompts\": [\"The";
  REQUIRE(send(socket_fd, half.data(), half.size(), 0) == static_cast<ssize_t>(half.size()));
  return socket_fd;
}

// A whole request, and then the connection closed without waiting for the answer.
void send_and_close(int port, const std::string& body) {
  const int socket_fd = connection_to(port);
  const std::string request =
      "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  REQUIRE(send(socket_fd, request.data(), request.size(), 0) ==
          static_cast<ssize_t>(request.size()));
  close(socket_fd);
}

// A response read by hand from a connection: its status and body (by Content-Length), or
// status 0 when none came whole within `timeout`, or the connection ended first.
struct RawResponse {
  int status = 0;
  std::string body;
};
RawResponse read_response(int socket_fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string received;
  RawResponse response;
  size_t length = std::string::npos;
  size_t body_start = 0;
  for (;;) {
    if (length == std::string::npos) {
      const size_t head_end = received.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        response.status = std::stoi(received.substr(9, 3));
        body_start = head_end + 4;
        const size_t field = received.find("Content-Length: ");
        length = field < head_end ? std::stoul(received.substr(field + 16)) : 0;
      }
    }
    if (length != std::string::npos && received.size() >= body_start + length) {
      response.body = received.substr(body_start, length);
      return response;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    pollfd watched{.fd = socket_fd, .events = POLLIN, .revents = 0};
    if (left <= 0 || poll(&watched, 1, static_cast<int>(left)) <= 0) return RawResponse{};
    char buffer[65536];
    const ssize_t got = recv(socket_fd, buffer, sizeof buffer, 0);
    if (got <= 0) return RawResponse{};
    received.append(buffer, static_cast<size_t>(got));
  }
}

// Sends `text` whole; false once the server has closed the connection.
bool send_all(int socket_fd, const std::string& text) {
  for (size_t sent = 0; sent < text.size();) {
    const ssize_t done = send(socket_fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (done <= 0) return false;
    sent += static_cast<size_t>(done);
  }
  return true;
}

}  // namespace

TEST_CASE("PUT /api answers Megatron's response, and greedy generation is the full forward's") {
  Server server;
  // Every field of the request (top_p_decay and top_p_bound need top_p, which excludes top_k).
  const std::string body = R"({"prompts": ["The cat sat on the", "She said:"],
    "tokens_to_generate": 6, "logprobs": true, "temperature": 0.8, "top_k": 0, "top_p": 0.9,
    "top_p_decay": 0.9, "top_p_bound": 0.5, "add_BOS": true, "stop_on_double_eol": false,
    "stop_on_eol": false, "prevent_newline_after_colon": true, "random_seed": 7,
    "no_log": false, "stop_token": 50256, "length_penalty": 1.0})";
  const auto answer = server.put(body);
  REQUIRE(answer);
  INFO(answer->body);
  REQUIRE(answer->status == 200);
  CHECK(answer->get_header_value("Content-Type") == "application/json");
  // Flask's jsonify: sorted keys, compact, a final newline.
  CHECK(answer->body.starts_with(R"({"logprobs":[[)"));
  CHECK(answer->body.ends_with("\"]}\n"));
  const nlohmann::json response = nlohmann::json::parse(answer->body);
  CHECK(response.size() == 3);

  // generate() over full forwards, with the same seed: the same draws.
  Reference reference;
  backend::GenerateRequest request;
  request.tokens_to_generate = 6;
  request.logprobs = true;
  request.temperature = 0.8;
  request.top_p = 0.9;
  request.top_p_decay = 0.9;
  request.top_p_bound = 0.5;
  request.add_BOS = true;
  request.prevent_newline_after_colon = true;
  request.random_seed = 7;
  auto check_against_reference = [&](const nlohmann::json& got,
                                     const std::vector<std::string>& prompts) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      const backend::GenerationResult expected = reference.generate(prompts[i], request, i);
      CHECK(got["text"][i] == expected.text);
      CHECK(got["segments"][i] == nlohmann::json(expected.segments));
      REQUIRE(got["logprobs"][i].size() == expected.logprobs.size());
      for (size_t j = 0; j < expected.logprobs.size(); ++j) {
        CHECK(got["logprobs"][i][j].get<double>() ==
              doctest::Approx(expected.logprobs[j]).epsilon(1e-4));
      }
    }
  };
  check_against_reference(response, {"The cat sat on the", "She said:"});

  // Greedy: at every step the argmax of a full forward (generate() checks that of itself).
  const auto greedy = server.put(
      R"({"prompts": ["Once upon a time", "The"], "tokens_to_generate": 8, "top_k": 1,
          "logprobs": true, "no_log": true})");
  REQUIRE(greedy);
  REQUIRE(greedy->status == 200);
  request = backend::GenerateRequest{};
  request.tokens_to_generate = 8;
  request.top_k = 1;
  request.logprobs = true;
  check_against_reference(nlohmann::json::parse(greedy->body), {"Once upon a time", "The"});

  // Without logprobs the field is absent; no_log leaves no log line.
  const auto quiet = server.put(R"({"prompts": ["Hello"], "tokens_to_generate": 2, "no_log": true})");
  REQUIRE(quiet);
  CHECK(quiet->status == 200);
  const nlohmann::json quiet_response = nlohmann::json::parse(quiet->body);
  CHECK(quiet_response.size() == 2);
  CHECK(quiet_response.contains("segments"));
  CHECK(quiet_response["text"][0].get<std::string>().starts_with("Hello"));
  // Scoring: tokens_to_generate 0 returns the prompt and its log-probabilities.
  const auto scored = server.put(R"({"prompts": ["The cat sat"], "tokens_to_generate": 0, "logprobs": true})");
  REQUIRE(scored);
  CHECK(scored->status == 200);
  const nlohmann::json scored_response = nlohmann::json::parse(scored->body);
  CHECK(scored_response["text"][0] == "The cat sat");
  CHECK(scored_response["logprobs"][0].size() == 2);
  const std::string log = server.log();
  std::ptrdiff_t logged = 0;
  for (size_t at = log.find("request from 127.0.0.1: 200"); at != std::string::npos;
       at = log.find("request from 127.0.0.1: 200", at + 1)) {
    ++logged;
  }
  CHECK(logged == 2);
}

TEST_CASE("bad requests get 400 and a message, and the server serves on") {
  Server server({"--max-request-bytes", "4096", "--max-tokens-to-generate", "32"});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompts": ["Hi"], )", "the request body is not JSON"},
      {R"({"prompts": []})", "prompts is empty"},
      {R"({"prompts": ["Hi"], "top_k": 2000})",
       "top_k must be equal to or greater than 0 and less than or equal to 1000"},
      {R"({"prompts": ["Hi"], "temperature": 0})",
       "temperature must be a positive number less than or equal to 100.0"},
      {R"({"prompts": ["Hi"], "temperature": 1e-300})", "temperature 1e-300 is too small"},
      {R"({"prompts": ["Hi"], "tokens_to_generate": 33})", "--max-tokens-to-generate"},
      {R"({"prompts": ["Hi"], "tokens_to_generate": 0})",
       "tokens_to_generate=0 implies logprobs should be True"},
      {R"({"prompts": [")" + words(40) + R"("], "tokens_to_generate": 30})",
       "Length of prompt + tokens_to_generate longer than allowed"},
      {R"({"prompts": [")" + std::string(5000, 'a') + R"("]})",
       "the request body is larger than --max-request-bytes 4096"},
  };
  // Named members, not a structured binding: clang 14 (the asan build) cannot capture one in
  // doctest's CAPTURE.
  for (const auto& request_case : cases) {
    const std::string& body = request_case.first;
    const std::string& message = request_case.second;
    const std::string shown = body.substr(0, 80);
    CAPTURE(shown);
    const auto answer = server.put(body);
    REQUIRE(answer);
    CHECK(answer->status == 400);
    const nlohmann::json response = nlohmann::json::parse(answer->body, nullptr, false);
    REQUIRE(response.is_object());
    CHECK(response["message"].get<std::string>().find(message) != std::string::npos);
  }
  httplib::Client client("127.0.0.1", server.port());
  const auto get = client.Get("/api");
  REQUIRE(get);
  CHECK(get->status == 405);
  CHECK(get->get_header_value("Allow") == "PUT");
  const auto elsewhere = client.Put("/generate", "{}", "application/json");
  REQUIRE(elsewhere);
  CHECK(elsewhere->status == 404);
  CHECK(nlohmann::json::parse(elsewhere->body).contains("message"));
  const auto good = server.put(R"({"prompts": ["Hi"], "tokens_to_generate": 3})");
  REQUIRE(good);
  CHECK(good->status == 200);
}

TEST_CASE("16 concurrent clients get their serial answers, while a stalled client waits alone") {
  // A read timeout far beyond the test's run even on a loaded machine: the stalled connection
  // must still be open when every answer has arrived, which it would not be if they had waited
  // for the server to give up on it.
  Server server({"--max-batch-size", "4", "--socket-timeout", "120"});
  auto body_of = [](int i) {
    return nlohmann::json{{"prompts", {"The cat sat on the", "Once upon a time"}},
                          {"tokens_to_generate", 5 + i % 3},
                          {"random_seed", 100 + i},
                          {"logprobs", i % 2 == 0},
                          {"no_log", true}}
        .dump();
  };
  std::vector<std::string> serial;
  for (int i = 0; i < 16; ++i) {
    const auto answer = server.put(body_of(i));
    REQUIRE(answer);
    REQUIRE(answer->status == 200);
    serial.push_back(answer->body);
  }
  // A client that sends half its request and goes quiet holds its connection, nothing more.
  const int stalled = stalled_connection(server.port());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> concurrent(16);
  std::vector<int> statuses(16, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      const auto answer = server.put(body_of(i));
      if (!answer) return;
      statuses[static_cast<size_t>(i)] = answer->status;
      concurrent[static_cast<size_t>(i)] = answer->body;
    });
  }
  for (auto& client : clients) client.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char byte = 0;
  const ssize_t read = recv(stalled, &byte, 1, MSG_DONTWAIT);
  const int read_error = errno;
  CHECK_MESSAGE((read < 0 && (read_error == EAGAIN || read_error == EWOULDBLOCK)),
                "the stalled connection was closed or answered before the others were served ("
                    << seconds << " s)");
  close(stalled);
  for (int i = 0; i < 16; ++i) {
    CAPTURE(i);
    CHECK(statuses[static_cast<size_t>(i)] == 200);
    const nlohmann::json expected = nlohmann::json::parse(serial[static_cast<size_t>(i)]);
    const nlohmann::json got =
        nlohmann::json::parse(concurrent[static_cast<size_t>(i)], nullptr, false);
    REQUIRE(got.is_object());
    CHECK(got["text"] == expected["text"]);
    CHECK(got["segments"] == expected["segments"]);
    if (i % 2 == 0) {
      REQUIRE(got["logprobs"].size() == expected["logprobs"].size());
      for (size_t p = 0; p < expected["logprobs"].size(); ++p) {
        REQUIRE(got["logprobs"][p].size() == expected["logprobs"][p].size());
        for (size_t j = 0; j < expected["logprobs"][p].size(); ++j) {
          CHECK(got["logprobs"][p][j].get<double>() ==
                doctest::Approx(expected["logprobs"][p][j].get<double>()).epsilon(1e-4));
        }
      }
    }
  }
  double stop_seconds = 0;
  CHECK(server.terminate(stop_seconds) == 0);
  CHECK(stop_seconds < 5.0);
}

TEST_CASE("a client that closes its connection while it waits has its request stopped") {
  Server server({"--max-batch-size", "1"});
  // 128 prompts of 60 tokens each through one slot: thousands of steps if it ran to its end.
  nlohmann::json prompts = nlohmann::json::array();
  for (int i = 0; i < 128; ++i) prompts.push_back("The");
  send_and_close(server.port(),
                 nlohmann::json{{"prompts", prompts}, {"tokens_to_generate", 60}}.dump());
  const std::string abandoned = "request from 127.0.0.1: 499 the client closed its connection";
  bool stopped = false;
  for (int i = 0; i < 600 && !stopped; ++i) {
    const std::string log = server.log();
    stopped = log.find(abandoned) != std::string::npos;
    if (log.find("200, 128 prompts") != std::string::npos) break;  // ran to its end
    if (!stopped) std::this_thread::sleep_for(100ms);
  }
  CHECK_MESSAGE(stopped, server.log());
  // The slot is free: the next client is served.
  const auto answer = server.put(R"({"prompts": ["The cat sat"], "tokens_to_generate": 3})");
  REQUIRE(answer);
  CHECK(answer->status == 200);
  double stop_seconds = 0;
  CHECK(server.terminate(stop_seconds) == 0);
  const std::string log = server.log();
  CHECK_MESSAGE(log.find("1 abandoned by their clients") != std::string::npos, log);
}

TEST_CASE("text_generation_cli drives the server from standard input, and SIGTERM exits 0") {
  Server server;
  const fs::path input = scratch() / "cli_input.txt";
  {
    std::ofstream out(input);
    out << "The cat sat\n3\nHello\n-1\n";
  }
  const auto run = launcher::run_and_capture(
      {"/bin/sh", "-c",
       "'" + kTestBin + "/text_generation_cli' 127.0.0.1:" + std::to_string(server.port()) + " < '" +
           input.string() + "'"});
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.starts_with(
      "Enter prompt: Enter number of tokens to generate: Megatron Response: \nThe cat sat"));
  CHECK(run.output.find("Enter prompt: Enter number of tokens to generate: Error 400: "
                        "tokens_to_generate must be an integer greater than or equal to 0\n") !=
        std::string::npos);
  const auto unreachable = launcher::run_and_capture(
      {"/bin/sh", "-c", "printf 'hi\\n3\\n' | '" + kTestBin + "/text_generation_cli' 127.0.0.1:1"});
  CHECK(unreachable.output.find("no answer from http://127.0.0.1:1") != std::string::npos);
  CHECK(unreachable.exit_code != 0);

  double seconds = 0;
  CHECK(server.terminate(seconds) == 0);
  CHECK(seconds < 5.0);
  CHECK(server.log().find("stopped on SIGTERM") != std::string::npos);
}

TEST_CASE("a load test: hey's 160 requests over 16 connections are all answered 200") {
  const bool hey = test_support::reference_available(
      "command -v hey", "the load tester hey",
      "Debian: apt-get install hey, or container/install-deps.sh --tests",
      [](const test_support::CommandResult& result) { return result.exit_status == 0; });
  if (!hey) return;
  Server server({"--max-batch-size", "8"});
  const auto run = launcher::run_and_capture(
      {"hey", "-n", "160", "-c", "16", "-m", "PUT", "-T", "application/json", "-d",
       R"({"prompts": ["The cat sat on the"], "tokens_to_generate": 4, "no_log": true})",
       "http://127.0.0.1:" + std::to_string(server.port()) + "/api"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const std::regex status_line(R"(\[(\d+)\]\s+(\d+) responses)");
  int answered = 0;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), status_line);
       it != std::sregex_iterator(); ++it) {
    CHECK((*it)[1] == "200");
    answered += std::stoi((*it)[2]);
  }
  CHECK(answered == 160);
  CHECK(run.output.find("Error distribution") == std::string::npos);
  const auto after = server.put(R"({"prompts": ["Hi"], "tokens_to_generate": 2})");
  REQUIRE(after);
  CHECK(after->status == 200);
}

TEST_CASE("one server bounds its clients: a chunked body over the limit is 400, a header flood 431, tricklers hold up nobody") {
  // One server (and one trained checkpoint: each test case is a process of its own) for the
  // three bounds a client once broke.
  Server server({"--max-request-bytes", "4096", "--socket-timeout", "2"});
  {
    // 32 MiB in chunks of 4 KiB, sent while the answer is read: the limit counts chunked bytes.
    const int socket_fd = connection_to(server.port());
    std::atomic<bool> stop = false;
    std::thread sender([&] {
      if (!send_all(socket_fd, "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                               "application/json\r\nTransfer-Encoding: chunked\r\n\r\n")) {
        return;
      }
      const std::string chunk = "1000\r\n" + std::string(4096, ' ') + "\r\n";
      for (int i = 0; i < 8192 && !stop; ++i) {
        if (!send_all(socket_fd, chunk)) return;
      }
    });
    const RawResponse answer = read_response(socket_fd, 20s);
    stop = true;
    shutdown(socket_fd, SHUT_RDWR);
    sender.join();
    close(socket_fd);
    CHECK(answer.status == 400);
    const nlohmann::json message = nlohmann::json::parse(answer.body, nullptr, false);
    REQUIRE(message.is_object());
    CHECK(message["message"] == "the request body is larger than --max-request-bytes 4096");
  }
  {
    // A million header fields (11 MB), the issue's: the server reads no more than its limits.
    std::string flood = "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    flood.reserve(12 << 20);
    for (int i = 0; i < 1'000'000; ++i) flood += "X-" + std::to_string(i) + ": a\r\n";
    const int socket_fd = connection_to(server.port());
    std::thread sender([&] { send_all(socket_fd, flood + "\r\n"); });
    const RawResponse answer = read_response(socket_fd, 20s);
    shutdown(socket_fd, SHUT_RDWR);
    sender.join();
    close(socket_fd);
    CHECK(answer.status == 431);
    const nlohmann::json message = nlohmann::json::parse(answer.body, nullptr, false);
    REQUIRE(message.is_object());
    CHECK(message["message"].get<std::string>().find("header fields") != std::string::npos);
  }
  const auto good = server.put(R"({"prompts": ["Hi"], "tokens_to_generate": 2})");
  REQUIRE(good);
  CHECK(good->status == 200);
  {
    // The issue's measurement: 80 clients sending a byte at a time, each within the timeout of a
    // read, once held every HTTP thread (--max-concurrent-requests 64 + 8) and a valid request
    // waited for them. Now they hold only their connections, and are cut at --socket-timeout
    // from their first byte.
    std::vector<int> tricklers;
    for (int i = 0; i < 80; ++i) tricklers.push_back(connection_to(server.port()));
    const std::string request =
        "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\n\r\n{}";
    std::atomic<bool> done = false;
    const auto start = std::chrono::steady_clock::now();
    // A byte per client every half second, for at most 4 s.
    std::thread trickle([&] {
      for (size_t at = 0; at < 8 && !done; ++at) {
        for (const int socket_fd : tricklers) send(socket_fd, &request[at], 1, MSG_NOSIGNAL);
        std::this_thread::sleep_for(500ms);
      }
    });
    std::this_thread::sleep_for(300ms);
    const auto asked = std::chrono::steady_clock::now();
    const auto answer = server.put(R"({"prompts": ["Hi"], "tokens_to_generate": 2, "no_log": true})");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
    REQUIRE(answer);
    CHECK(answer->status == 200);
    CHECK(seconds < 1.0);
    // Each trickler is answered 408 at its deadline, 2 s after its first byte.
    int cut = 0;
    for (const int socket_fd : tricklers) {
      const RawResponse timed_out = read_response(socket_fd, 5s);
      if (timed_out.status == 408) ++cut;
    }
    const double cut_after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done = true;
    trickle.join();
    for (const int socket_fd : tricklers) close(socket_fd);
    CHECK(cut == 80);
    CHECK(cut_after >= 1.9);
    CHECK(cut_after < 4.0);
  }
}

TEST_CASE("--max-concurrent-requests 100000000 is refused with exit 2 before the server serves") {
  // It once made 100000000 + 8 threads before listening, ignoring SIGINT while the machine ran
  // out of process ids.
  const auto run = test_support::run_bounded(
      join(join({kTestBin + "/text_generation_server"}, tiny_lambada_model_flags()),
           // Refused while the flags are parsed: no checkpoint is read (nor trained).
           {"--load", "/nonexistent", "--port", "0", "--max-concurrent-requests", "100000000"}));
  test_support::check_refused(run, "--max-concurrent-requests takes an integer in [1, 4096]");
  CHECK(run.output.find("serving on") == std::string::npos);
}
