// fork/execvp with a pipe; see process.hpp.
#include "launcher/process.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/common/error.hpp"

namespace launcher {

namespace {

struct Child {
  pid_t pid = -1;
  int output_fd = -1;  // read end of the child's stdout+stderr
};

// fork + execvp with the errno of a failed exec reported back through a close-on-exec pipe
// (it closes unread when the exec succeeds), so "cannot run X" is an error in the parent.
// `prepare_child` runs in the child between fork and exec (redirections, setsid); it must only
// make async-signal-safe calls.
template <typename PrepareChild>
pid_t fork_and_exec(const std::vector<std::string>& argv, PrepareChild&& prepare_child) {
  if (argv.empty()) common::fail("cannot run an empty command");
  int exec_status[2];
  if (pipe2(exec_status, O_CLOEXEC) != 0) common::fail("pipe failed: {}", std::strerror(errno));
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) common::fail("fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    prepare_child();
    execvp(args[0], args.data());
    const int error = errno;
    (void)!write(exec_status[1], &error, sizeof error);
    _exit(127);
  }
  close(exec_status[1]);
  int error = 0;
  const ssize_t got = read(exec_status[0], &error, sizeof error);
  close(exec_status[0]);
  if (got == static_cast<ssize_t>(sizeof error)) {
    waitpid(pid, nullptr, 0);
    common::fail("cannot run {}: {}", argv[0], std::strerror(error));
  }
  return pid;
}

Child spawn(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) common::fail("pipe failed: {}", std::strerror(errno));
  try {
    const pid_t pid = fork_and_exec(argv, [&] {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
    });
    close(fds[1]);
    return {pid, fds[0]};
  } catch (...) {
    close(fds[0]);
    close(fds[1]);
    throw;
  }
}

int wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) common::fail("waitpid failed: {}", std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

template <typename Sink>
void drain(int fd, Sink&& sink) {
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      sink(std::string_view(buffer, static_cast<size_t>(n)));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
}

}  // namespace

int start_detached(const std::vector<std::string>& argv) {
  return fork_and_exec(argv, [] {
    setsid();
    const int null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      dup2(null_fd, STDIN_FILENO);
      dup2(null_fd, STDOUT_FILENO);
      dup2(null_fd, STDERR_FILENO);
    }
  });
}

std::optional<std::filesystem::path> find_on_path(std::string_view program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string_view remaining(path);
  while (!remaining.empty()) {
    const size_t colon = remaining.find(':');
    const std::string_view directory = remaining.substr(0, colon);
    remaining = colon == std::string_view::npos ? std::string_view() : remaining.substr(colon + 1);
    if (directory.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(directory) / program;
    if (access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
  }
  return std::nullopt;
}

CapturedRun run_and_capture(const std::vector<std::string>& argv) {
  Child child = spawn(argv);
  CapturedRun result;
  drain(child.output_fd, [&](std::string_view chunk) { result.output.append(chunk); });
  result.exit_code = wait_for(child.pid);
  return result;
}

int run_and_tee(const std::vector<std::string>& argv,
                const std::function<std::filesystem::path(int pid)>& log_file_for,
                std::ostream& terminal) {
  Child child = spawn(argv);
  const std::filesystem::path log_path = log_file_for(child.pid);
  std::ofstream log(log_path, std::ios::binary);
  if (!log) {
    kill(child.pid, SIGTERM);
    wait_for(child.pid);
    common::fail("cannot write the job log {}", log_path.string());
  }
  drain(child.output_fd, [&](std::string_view chunk) {
    terminal.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    terminal.flush();
    log.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    log.flush();
  });
  return wait_for(child.pid);
}

}  // namespace launcher
