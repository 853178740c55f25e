// A text_generation_server process for the e2e tests: started with --port 0 (it prints the
// port it bound: "serving on http://127.0.0.1:PORT/api"), waited for, asked over HTTP, and
// stopped with SIGTERM (or killed when the test ends first).
#pragma once

#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "spawned_process.hpp"

namespace test_support {

class GenerationServerProcess {
 public:
  // `argv`: the server and its flags (without --port); its output goes to `log`.
  GenerationServerProcess(std::vector<std::string> argv, const std::filesystem::path& log)
      : log_(log) {
    using namespace std::chrono_literals;
    argv.insert(argv.end(), {"--port", "0"});
    pid_ = spawn_process(argv, log_);
    const std::regex serving(R"(serving on http://127\.0\.0\.1:(\d+)/api)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch match;
      const std::string text = log_text();
      if (std::regex_search(text, match, serving)) port_ = std::stoi(match[1]);
      else std::this_thread::sleep_for(100ms);
      int status = 0;
      if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("text_generation_server exited before serving:\n" << log_text());
      }
    }
    INFO(log_text());
    REQUIRE(port_ > 0);
  }
  GenerationServerProcess(const GenerationServerProcess&) = delete;
  GenerationServerProcess& operator=(const GenerationServerProcess&) = delete;
  ~GenerationServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string log_text() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // SIGTERM, then the exit status (a SIGKILL after 20 s counts as a hang: 137).
  int terminate(double& seconds) {
    using namespace std::chrono_literals;
    const auto start = std::chrono::steady_clock::now();
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 2000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    seconds = 20;
    return 137;
  }
  httplib::Result put(const std::string& body) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(60, 0);
    return client.Put("/api", body, "application/json");
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace test_support
