// A real, private Slurm cluster for end-to-end tests: one slurmctld and two slurmd (node1,
// node2) on this machine, plus a private munged, all configured from a slurm.conf in a temp
// directory. It is started and stopped by tests/slurm/local-cluster.sh (`up --dir DIR`, `down
// --dir DIR`), the one way to get such a cluster, which docs/launcher.md ("Trying it on a local
// Slurm") gives users too; the script writes slurm.conf, picks free ports (retrying when a daemon
// loses a race for one), and waits for `scontrol ping` and two idle nodes. Tests point Slurm's
// clients (sbatch, scontrol, the launcher) at it through environment() (SLURM_CONF=...), so what
// the launcher renders is judged by Slurm itself, not by string matching. Header-only because
// tests/CMakeLists.txt compiles only *_test.cpp.
//
// Isolation, so that test processes can run concurrently (ctest -j): every path (state, spool,
// logs, pid files, munge key and socket) lies in the cluster's own mkdtemp directory, the ports
// are a random free block (the script's), and munged is private (AuthInfo=socket=...), so no
// test ever starts or stops a daemon another test relies on.
// Lifetime: the script starts the daemons in sessions of their own; while the cluster lives the
// test process is a child subreaper, so they (and slurmstepd, and the job processes) are
// reparented to it and reaped, not left as zombies. A forked guard, woken when the test process
// closes a pipe (in the destructor, or by dying, even by SIGKILL), kills every process still
// naming the cluster's directory and removes it, so none outlives a crashed test. The
// destructor first runs `local-cluster.sh down` (cancel jobs, `scontrol shutdown`, then stop what
// is left by pid).
//
// Needs root (SlurmUser=SlurmdUser=root) and the Debian packages slurm-wlm and munge, which
// container/install-deps.sh installs. Without them a test calls slurm_cluster_available(),
// which fails under CI and otherwise skips with a message naming the missing packages.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_files.hpp"

extern char** environ;

namespace slurm_test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct CommandResult {
  int exit_code = -1;     // 128 + signal when killed by a signal
  std::string output;     // stdout and stderr together
  bool timed_out = false;  // killed because it ran past its timeout
};

// The current environment with `overrides` ("NAME=value") replacing or adding variables.
// Slurm's own variables (SLURM_*, SBATCH_*, SRUN_*, ...) are dropped: were the tests run inside
// a job of some real cluster, they would point sbatch and srun at that job and its options.
inline std::vector<std::string> environment_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> result;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    const std::string name = variable.substr(0, variable.find('='));
    bool overridden = false;
    for (const char* slurm_prefix : {"SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_"}) {
      overridden = overridden || name.starts_with(slurm_prefix);
    }
    for (const auto& override_entry : overrides) {
      overridden = overridden || override_entry.substr(0, override_entry.find('=')) == name;
    }
    if (!overridden) result.push_back(variable);
  }
  result.insert(result.end(), overrides.begin(), overrides.end());
  return result;
}

inline std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Runs argv (argv[0] an absolute path, or found on the current PATH) with extra environment
// variables, capturing its output; after `timeout` its whole process group is killed, so a
// wedged Slurm client or launcher can never hang a test.
inline CommandResult run_command(std::vector<std::string> argv,
                                 const std::vector<std::string>& environment_overrides,
                                 std::chrono::milliseconds timeout) {
  std::vector<std::string> environment = environment_with(environment_overrides);
  std::vector<char*> args = c_strings(argv);
  std::vector<char*> envp = c_strings(environment);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed: " + std::string(strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed: " + std::string(strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    const int null_fd = open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execvpe(args[0], args.data(), envp.data());
    const std::string message = "cannot run " + argv[0] + ": " + strerror(errno) + "\n";
    (void)!write(STDERR_FILENO, message.data(), message.size());
    _exit(127);
  }
  close(fds[1]);
  CommandResult result;
  const auto deadline = Clock::now() + timeout;
  char buffer[8192];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      break;
    }
    pollfd poll_fd{fds[0], POLLIN, 0};
    const int ready = poll(&poll_fd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n > 0) {
      result.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;  // EOF: the program (and whatever inherited its output) is done
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (result.timed_out) {
    result.output += "\n[killed after " + std::to_string(timeout.count()) + " ms: " + argv[0] + "]";
  }
  return result;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The job ids of "Submitted batch job N" lines in a launcher.log, in submission order.
inline std::vector<std::string> submitted_job_ids(const fs::path& launcher_log) {
  static const std::regex kSubmitted(R"(Submitted batch job (\d+))");
  const std::string text = read_text(launcher_log);
  std::vector<std::string> ids;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kSubmitted); it != std::sregex_iterator(); ++it) {
    ids.push_back((*it)[1].str());
  }
  return ids;
}

inline std::string last_lines(const std::string& text, size_t count) {
  size_t at = text.size();
  for (size_t lines = 0; at > 0 && lines <= count; --at) {
    if (text[at - 1] == '\n' && ++lines > count) break;
  }
  return text.substr(at);
}

// A program's absolute path: $PATH first, then the sbin directories root's PATH usually has.
inline std::optional<fs::path> find_program(const std::string& name) {
  std::string directories = std::getenv("PATH") ? std::getenv("PATH") : "";
  directories += ":/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin";
  std::stringstream stream(directories);
  for (std::string directory; std::getline(stream, directory, ':');) {
    if (directory.empty()) continue;
    const fs::path candidate = fs::path(directory) / name;
    if (access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
  }
  return std::nullopt;
}

// The programs the cluster needs and the Debian package (all pulled in by slurm-wlm and munge)
// that ships each.
inline const std::vector<std::pair<std::string, std::string>>& required_programs() {
  static const std::vector<std::pair<std::string, std::string>> programs = {
      {"slurmctld", "slurmctld"}, {"slurmd", "slurmd"},         {"sbatch", "slurm-client"},
      {"srun", "slurm-client"},   {"scontrol", "slurm-client"}, {"sinfo", "slurm-client"},
      {"squeue", "slurm-client"}, {"scancel", "slurm-client"},  {"munged", "munge"}};
  return programs;
}

// True when this machine can run the cluster. Otherwise: under CI (CI=true) the test fails,
// since container/install-deps.sh should have installed Slurm; elsewhere it is skipped with a
// message naming what is missing, and the caller returns early.
inline bool slurm_cluster_available() {
  std::vector<std::string> missing;
  std::vector<std::string> packages;
  for (const auto& [program, package] : required_programs()) {
    if (find_program(program)) continue;
    missing.push_back(program);
    if (std::find(packages.begin(), packages.end(), package) == packages.end()) packages.push_back(package);
  }
  std::string problem;
  if (!missing.empty()) {
    std::string programs;
    std::string names;
    for (const auto& program : missing) programs += (programs.empty() ? "" : ", ") + program;
    for (const auto& package : packages) names += (names.empty() ? "" : " ") + package;
    problem = "the Slurm programs " + programs + " are missing (Debian packages: " + names +
              "; slurm-wlm and munge pull them all in)";
  } else if (geteuid() != 0) {
    problem = "the Slurm test cluster runs its daemons with SlurmUser=root and needs root";
  }
  if (problem.empty()) return true;
  if (test_support::running_under_ci()) {
    FAIL(problem << ": under CI container/install-deps.sh should have installed them "
                    "(run `bash container/install-deps.sh` as root)");
  }
  MESSAGE("skipping the real-Slurm test: " << problem
          << " (install with `bash container/install-deps.sh`)");
  return false;
}

// How a job ended, from `scontrol show job -o <id>`.
struct JobOutcome {
  bool finished = false;  // false: still pending/running when the wait ran out
  std::string state;      // JobState, e.g. COMPLETED, FAILED
  std::string exit_code;  // ExitCode "<status>:<signal>", e.g. 0:0, 2:0
  std::string record;     // the whole scontrol line, for messages
};

// A direct child process (the cluster guard), stopped by pid.
struct Daemon {
  std::string name;
  pid_t pid = -1;
  fs::path output;  // its stdout/stderr
  int exit_status = -1;

  bool alive() {
    if (pid <= 0) return false;
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == 0) return true;
    if (got == pid) exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pid = -1;
    return false;
  }

  // Waits up to `grace` for it to exit by itself, then SIGTERM, then SIGKILL.
  void stop(std::chrono::milliseconds grace) {
    for (int signal_number : {0, SIGTERM, SIGKILL}) {
      if (signal_number != 0 && pid > 0) kill(pid, signal_number);
      const auto deadline = Clock::now() + (signal_number == 0 ? grace : 2000ms);
      while (alive() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
      if (!alive()) return;
    }
  }
};

// The pids of this process's direct children, zombies included.
inline std::vector<pid_t> child_processes() {
  std::vector<pid_t> children;
  const pid_t self = getpid();
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(entry.path() / "stat");
    const size_t close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(close_paren + 1));
    std::string state;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent == self) children.push_back(std::stoi(name));
  }
  return children;
}

// SIGKILLs, until none is left or `timeout` passes, every process whose command line or
// environment names `directory`: the daemons (-f <dir>/slurm.conf), slurmstepd and every job
// process (they inherit SLURM_CONF=<dir>/slurm.conf), a launcher run against the cluster.
inline void kill_processes_naming(const std::string& directory, std::chrono::milliseconds timeout) {
  const pid_t self = getpid();
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<pid_t> found;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator("/proc", error)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = std::stoi(name);
      if (pid == self) continue;
      if (read_text(entry.path() / "environ").find(directory) != std::string::npos ||
          read_text(entry.path() / "cmdline").find(directory) != std::string::npos) {
        found.push_back(pid);
      }
    }
    if (found.empty() || Clock::now() >= deadline) return;
    for (pid_t pid : found) kill(pid, SIGKILL);
    std::this_thread::sleep_for(50ms);
  }
}

// A forked guard that outlives the test process by moments: it blocks on a pipe whose only
// writer is the test process, and when that closes (the destructor closes it, or the kernel
// does when the test process dies, even by SIGKILL) it kills whatever still names the cluster's
// directory (the daemons, slurmstepd and the job processes) and removes the directory.
inline pid_t start_guard(const fs::path& directory, int& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed: " + std::string(strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork for the cluster guard failed: " + std::string(strerror(errno)));
  if (pid == 0) {
    // Ctrl-C reaches the whole process group: the guard must still clean up after it.
    for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) signal(signal_number, SIG_IGN);
    const int null_fd = open("/dev/null", O_RDWR);
    for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) dup2(null_fd, fd);  // no ctest pipe held
    dup2(fds[0], 3);
    close_range(4, ~0U, 0);
    char byte = 0;
    while (read(3, &byte, 1) < 0 && errno == EINTR) {
    }
    kill_processes_naming(directory.string(), 10s);
    std::error_code error;
    fs::remove_all(directory, error);
    _exit(0);  // not exit(): no doctest or static destructors in this copy of the test process
  }
  close(fds[0]);
  write_end = fds[1];
  return pid;
}

// tests/slurm/local-cluster.sh, which starts and stops the cluster.
inline fs::path local_cluster_script() {
  return fs::path(TEST_SOURCE_DIR) / "tests" / "slurm" / "local-cluster.sh";
}

class SlurmTestCluster {
 public:
  static constexpr int kNodes = 2;

  SlurmTestCluster() {
    for (const auto& [program, package] : required_programs()) {
      const auto path = find_program(program);
      if (!path) throw std::runtime_error(program + " not found (package " + package + ")");
      programs_.emplace_back(program, path->string());
    }
    std::string pattern = (fs::temp_directory_path() / "slurm_test_cluster_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + " failed: " + strerror(errno));
    }
    directory_ = pattern;
    int was_subreaper = 0;
    prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper);
    was_subreaper_ = was_subreaper != 0;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    try {
      guard_pid_ = start_guard(directory_, guard_pipe_);
      started_ = true;  // from here `down` stops whatever a failed `up` left
      const CommandResult up = script("up", {"--nodes", std::to_string(kNodes)}, 120s);
      if (up.exit_code != 0) {
        throw std::runtime_error(local_cluster_script().string() + " up --dir " + directory_.string() +
                                 " failed (exit " + std::to_string(up.exit_code) + "):\n" + up.output +
                                 "\n" + diagnostics());
      }
    } catch (...) {
      shut_down();
      throw;
    }
  }

  SlurmTestCluster(const SlurmTestCluster&) = delete;
  SlurmTestCluster& operator=(const SlurmTestCluster&) = delete;

  ~SlurmTestCluster() { shut_down(); }

  // What a child process needs to talk to this cluster: SLURM_CONF, and a PATH with sbatch.
  std::vector<std::string> environment() const {
    const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
    return {"SLURM_CONF=" + slurm_conf().string(),
            "PATH=" + fs::path(program("sbatch")).parent_path().string() + ":" + path};
  }

  fs::path slurm_conf() const { return directory_ / "slurm.conf"; }
  const fs::path& directory() const { return directory_; }

  // Runs a Slurm client (sbatch, scontrol, ...) against this cluster.
  CommandResult client(const std::string& name, std::vector<std::string> arguments,
                       std::chrono::milliseconds timeout = 20s) const {
    arguments.insert(arguments.begin(), program(name));
    return run_command(arguments, environment(), timeout);
  }

  // Polls `scontrol show job -o <id>` until the job reaches a final state or `timeout` passes.
  JobOutcome wait_for_job(const std::string& job_id, std::chrono::milliseconds timeout) const {
    static const std::vector<std::string> kFinalStates = {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
        "PREEMPTED", "BOOT_FAIL", "DEADLINE"};
    JobOutcome outcome;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const CommandResult shown = client("scontrol", {"show", "job", "-o", job_id}, 10s);
      outcome.record = shown.output;
      outcome.state = field(shown.output, "JobState");
      outcome.exit_code = field(shown.output, "ExitCode");
      if (std::find(kFinalStates.begin(), kFinalStates.end(), outcome.state) != kFinalStates.end()) {
        outcome.finished = true;
        return outcome;
      }
      if (Clock::now() >= deadline) return outcome;
      std::this_thread::sleep_for(200ms);
    }
  }

  // The last lines of every daemon log, for failure messages.
  std::string diagnostics() const {
    std::string text;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(directory_, error)) {
      const std::string name = entry.path().filename().string();
      if (!name.ends_with(".log") && !name.ends_with(".out")) continue;
      text += "==> " + entry.path().string() + " <==\n" + last_lines(read_text(entry.path()), 15) + "\n";
    }
    return text;
  }

 private:
  static std::string field(const std::string& record, const std::string& name) {
    const std::string key = " " + name + "=";
    size_t at = (" " + record).find(key);
    if (at == std::string::npos) return "";
    at += key.size() - 1;  // the leading space was added
    const size_t end = record.find_first_of(" \n", at);
    return record.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }

  std::string program(const std::string& name) const {
    for (const auto& [program_name, path] : programs_) {
      if (program_name == name) return path;
    }
    throw std::runtime_error("the Slurm test cluster does not know the program " + name);
  }

  // local-cluster.sh <action> --dir <this cluster's directory> <arguments>.
  CommandResult script(const std::string& action, const std::vector<std::string>& arguments,
                       std::chrono::milliseconds timeout) const {
    std::vector<std::string> argv = {"/bin/bash", local_cluster_script().string(), action, "--dir",
                                     directory_.string()};
    argv.insert(argv.end(), arguments.begin(), arguments.end());
    return run_command(argv, {}, timeout);
  }

  void shut_down() {
    // Cancels the jobs, `scontrol shutdown`, stops what is left; the guard removes the directory.
    if (started_) script("down", {"--keep"}, 60s);
    started_ = false;
    // slurmstepd and job processes detach from slurmd: the guard kills whatever still names the
    // cluster's directory, then removes it.
    if (guard_pipe_ >= 0) close(guard_pipe_);
    guard_pipe_ = -1;
    if (guard_pid_ > 0) {
      Daemon guard{"cluster guard", guard_pid_, {}};
      guard.stop(15000ms);
      guard_pid_ = -1;
    }
    // Orphans of the cluster came to this process (a subreaper while the cluster lived): reap
    // them, so no zombie is handed on to an init that may not reap.
    const auto deadline = Clock::now() + 2s;
    while (!child_processes().empty() && Clock::now() < deadline) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      std::this_thread::sleep_for(20ms);
    }
    if (!was_subreaper_) prctl(PR_SET_CHILD_SUBREAPER, 0);
    std::error_code error;
    fs::remove_all(directory_, error);
  }

  fs::path directory_;
  std::vector<std::pair<std::string, std::string>> programs_;  // name → absolute path
  bool was_subreaper_ = false;
  bool started_ = false;  // `up` ran: `down` has something to stop
  pid_t guard_pid_ = -1;
  int guard_pipe_ = -1;  // the write end the guard waits on
};

}  // namespace slurm_test
