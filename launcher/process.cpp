// Running programs with posix_spawnp, their output through a pipe; see process.hpp.
#include "launcher/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <spdlog/spdlog.h>

#include "backend/common/error.hpp"

extern char** environ;

namespace launcher {

namespace {

struct Child {
  pid_t pid = -1;
  int output_fd = -1;  // read end of the child's stdout+stderr
};

// posix_spawnp, not fork + exec: the launcher (and the tests that run it from several threads)
// may be multithreaded, and a forked child of a multithreaded process may only make
// async-signal-safe calls until it execs; under AddressSanitizer a fork taken while another
// thread held the allocator's lock left the child waiting on it forever. glibc's posix_spawn
// runs nothing of ours in the child and reports a failed exec as its return value, so
// "cannot run X" is an error in the parent.
class SpawnSettings {
 public:
  SpawnSettings() {
    posix_spawn_file_actions_init(&actions_);
    posix_spawnattr_init(&attributes_);
  }
  ~SpawnSettings() {
    posix_spawn_file_actions_destroy(&actions_);
    posix_spawnattr_destroy(&attributes_);
  }
  SpawnSettings(const SpawnSettings&) = delete;
  SpawnSettings& operator=(const SpawnSettings&) = delete;

  // The child's `target` descriptor is a copy of this process's `source`.
  void duplicate(int source, int target) {
    check(posix_spawn_file_actions_adddup2(&actions_, source, target), "adddup2");
  }
  // The child's `target` descriptor is `path` opened with `flags`.
  void open(int target, const char* path, int flags) {
    check(posix_spawn_file_actions_addopen(&actions_, target, path, flags, 0), "addopen");
  }
  // The child leads a new session (no controlling terminal; a hang-up of ours is not its).
  void new_session() { check(posix_spawnattr_setflags(&attributes_, POSIX_SPAWN_SETSID), "setflags"); }
  // The child leads a new process group, which can then be signalled as a whole.
  void new_process_group() {
    check(posix_spawnattr_setpgroup(&attributes_, 0), "setpgroup");
    check(posix_spawnattr_setflags(&attributes_, POSIX_SPAWN_SETPGROUP), "setflags");
  }

  pid_t run(const std::vector<std::string>& argv) const {
    if (argv.empty()) common::fail("cannot run an empty command");
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    const int error = posix_spawnp(&pid, args[0], &actions_, &attributes_, args.data(), environ);
    if (error != 0) common::fail("cannot run {}: {}", argv[0], std::strerror(error));
    return pid;
  }

 private:
  static void check(int error, const char* step) {
    if (error != 0) common::fail("cannot prepare a process (posix_spawn {}): {}", step, std::strerror(error));
  }
  posix_spawn_file_actions_t actions_;
  posix_spawnattr_t attributes_;
};

Child spawn(const std::vector<std::string>& argv, bool own_process_group = false) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) common::fail("pipe failed: {}", std::strerror(errno));
  try {
    SpawnSettings settings;
    if (own_process_group) {
      settings.new_process_group();
      // Outside the terminal's foreground group a read from the terminal would stop the job
      // (SIGTTIN; mpirun forwards stdin to rank 0), so it reads nothing instead.
      settings.open(STDIN_FILENO, "/dev/null", O_RDONLY);
    }
    // dup2 clears close-on-exec on the copies; the pipe's own descriptors close at exec.
    settings.duplicate(fds[1], STDOUT_FILENO);
    settings.duplicate(fds[1], STDERR_FILENO);
    const pid_t pid = settings.run(argv);
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

// The signal that asked this launcher to stop while it ran a time-limited job, 0 if none. Set
// by the handler InterruptForwarding installs; read by run_and_tee's loop.
volatile std::sig_atomic_t received_stop_signal = 0;

extern "C" void remember_stop_signal(int signal) { received_stop_signal = signal; }

// While a time-limited job runs in its own process group, the terminal's Ctrl-C (and a SIGTERM
// or SIGHUP sent to the launcher) would reach the launcher alone and leave the job running,
// orphaned: these handlers only note the signal, and run_and_tee passes it on to the job's
// group. A signal this process was started ignoring (nohup) stays ignored. The previous
// dispositions come back when the job has ended.
class InterruptForwarding {
 public:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

  InterruptForwarding() {
    received_stop_signal = 0;
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler == SIG_IGN) continue;
      struct sigaction action {};
      action.sa_handler = remember_stop_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = 0;  // no SA_RESTART: poll returns EINTR at once
      sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~InterruptForwarding() {
    for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  InterruptForwarding(const InterruptForwarding&) = delete;
  InterruptForwarding& operator=(const InterruptForwarding&) = delete;

 private:
  struct sigaction previous_[std::size(kSignals)] {};
};

}  // namespace

void stop_by_signal(int signal) {
  spdlog::default_logger()->flush();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
  _exit(128 + signal);  // only if the signal was blocked
}

int start_detached(const std::vector<std::string>& argv) {
  SpawnSettings settings;
  settings.new_session();
  settings.open(STDIN_FILENO, "/dev/null", O_RDONLY);
  settings.open(STDOUT_FILENO, "/dev/null", O_WRONLY);
  settings.open(STDERR_FILENO, "/dev/null", O_WRONLY);
  return settings.run(argv);
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

TeedRun run_and_tee(const std::vector<std::string>& argv,
                    const std::function<std::filesystem::path(int pid)>& log_file_for,
                    std::ostream& terminal, std::optional<std::chrono::milliseconds> time_limit) {
  using Clock = std::chrono::steady_clock;
  // Installed before the child starts, so no signal falls between its start and the handlers.
  std::optional<InterruptForwarding> forwarding;
  if (time_limit) forwarding.emplace();
  Child child = spawn(argv, time_limit.has_value());
  const std::filesystem::path log_path = log_file_for(child.pid);
  std::ofstream log(log_path, std::ios::binary);
  if (!log) {
    kill(child.pid, SIGTERM);
    wait_for(child.pid);
    common::fail("cannot write the job log {}", log_path.string());
  }
  auto copy = [&](std::string_view chunk) {
    terminal.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    terminal.flush();
    log.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    log.flush();
  };
  TeedRun run;
  if (!time_limit) {
    drain(child.output_fd, copy);
    run.exit_code = wait_for(child.pid);
    return run;
  }
  // The next thing to do when the pipe stays quiet: SIGTERM at the limit, SIGKILL 5 s later,
  // then stop reading 5 s after that (a process that left the group may hold the pipe open).
  // A stop signal sent to the launcher goes to the group at once, then the same SIGKILL.
  constexpr std::chrono::seconds kGrace{5};
  // poll wakes at least this often: the signal may have gone to another thread of this process,
  // leaving this one's poll uninterrupted.
  constexpr std::chrono::milliseconds kSignalCheck{100};
  Clock::time_point next_step = Clock::now() + *time_limit;
  int steps_taken = 0;
  for (;;) {
    if (received_stop_signal != 0 && run.interrupted_by == 0) {
      run.interrupted_by = received_stop_signal;
      kill(-child.pid, run.interrupted_by);
      steps_taken = 1;
      next_step = Clock::now() + kGrace;
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_step - Clock::now());
    pollfd output{child.output_fd, POLLIN, 0};
    const int64_t timeout_ms = std::clamp<int64_t>(wait.count(), 0, kSignalCheck.count());
    const int ready = poll(&output, 1, static_cast<int>(timeout_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (Clock::now() < next_step) continue;
      if (steps_taken == 2) break;
      kill(-child.pid, steps_taken == 0 ? SIGTERM : SIGKILL);
      if (run.interrupted_by == 0) run.timed_out = true;
      ++steps_taken;
      next_step = Clock::now() + kGrace;
      continue;
    }
    char buffer[8192];
    const ssize_t n = read(child.output_fd, buffer, sizeof buffer);
    if (n > 0) {
      copy(std::string_view(buffer, static_cast<size_t>(n)));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(child.output_fd);
  run.exit_code = wait_for(child.pid);
  // A stop signal that came as the job ended still stops the caller.
  if (run.interrupted_by == 0) run.interrupted_by = received_stop_signal;
  return run;
}

}  // namespace launcher
