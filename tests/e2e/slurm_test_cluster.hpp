// A real, private Slurm cluster for end-to-end tests: one slurmctld and two slurmd (node1,
// node2) on this machine, plus a private munged, all configured from a slurm.conf in a temp
// directory. Tests point Slurm's clients (sbatch, scontrol, the launcher) at it through
// environment() (SLURM_CONF=...), so what the launcher renders is judged by Slurm itself, not
// by string matching. Header-only because tests/CMakeLists.txt compiles only *_test.cpp.
//
// Isolation, so that test processes can run concurrently (ctest -j):
//  - every path (state, spool, logs, pid files) lies in the cluster's temp directory;
//  - the TCP ports (slurmctld + one per slurmd) are picked at random from 10000-32000 and
//    bind-tested; if a daemon still loses a race for one ("Address already in use"), start-up
//    is retried with fresh ports;
//  - munged is private too: its own key and socket (AuthInfo=socket=...), never the system
//    one at /run/munge, so no test ever starts or stops a daemon another test relies on.
// Lifetime: the daemons run in the foreground as children of the test process with
// PR_SET_PDEATHSIG=SIGKILL, so none can outlive it even if it crashes. slurmstepd and job
// processes detach from slurmd; a forked guard, woken when the test process closes a pipe (in
// the destructor, or by dying, even by SIGKILL), kills every process still naming the cluster's
// directory and removes it. The destructor first cancels jobs and runs `scontrol shutdown`,
// then stops what is left by pid (SIGTERM, then SIGKILL). While the cluster lives the test
// process is a child subreaper, so the orphans it inherits are reaped, not left as zombies.
//
// Needs root (SlurmUser=SlurmdUser=root) and the Debian packages slurm-wlm and munge, which
// container/install-deps.sh installs. Without them a test calls slurm_cluster_available(),
// which fails under CI and otherwise skips with a message naming the missing packages.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
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

inline bool tcp_port_is_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return free;
}

// `count` consecutive free TCP ports, below Linux's ephemeral range (32768+) so that no
// outgoing connection takes one between the test and the daemon's bind. The start is random
// (seeded per process) so concurrent test processes rarely even try the same block.
inline int pick_free_port_block(int count) {
  std::mt19937 random(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> start(10000, 32000 - count);
  for (int attempt = 0; attempt < 500; ++attempt) {
    const int base = start(random);
    bool all_free = true;
    for (int port = base; port < base + count && all_free; ++port) all_free = tcp_port_is_free(port);
    if (all_free) return base;
  }
  throw std::runtime_error("no block of " + std::to_string(count) +
                           " free TCP ports in 10000-32000 for the Slurm test cluster");
}

// How a job ended, from `scontrol show job -o <id>`.
struct JobOutcome {
  bool finished = false;  // false: still pending/running when the wait ran out
  std::string state;      // JobState, e.g. COMPLETED, FAILED
  std::string exit_code;  // ExitCode "<status>:<signal>", e.g. 0:0, 2:0
  std::string record;     // the whole scontrol line, for messages
};

// A direct child daemon, started in the foreground.
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

inline Daemon start_daemon(const std::string& name, std::vector<std::string> argv,
                           const std::vector<std::string>& environment_overrides,
                           const fs::path& output) {
  std::vector<std::string> environment = environment_with(environment_overrides);
  std::vector<char*> args = c_strings(argv);
  std::vector<char*> envp = c_strings(environment);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork for " + name + " failed: " + strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test process
    if (getppid() != parent) _exit(1);
    const int null_fd = open("/dev/null", O_RDONLY);
    const int out_fd = open(output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(null_fd, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    close_range(3, ~0U, 0);  // no ctest pipes or test files leak into the daemons
    execve(args[0], args.data(), envp.data());
    const std::string message = "cannot run " + argv[0] + ": " + strerror(errno) + "\n";
    (void)!write(STDERR_FILENO, message.data(), message.size());
    _exit(127);
  }
  return Daemon{name, pid, output};
}

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
// directory and removes the directory. PR_SET_PDEATHSIG covers the daemons the test started
// itself; this covers slurmstepd and the job processes, which detach from slurmd.
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
      start();
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

  fs::path munge_socket() const { return directory_ / "munge.socket"; }

  void write_munge_key() const {
    const fs::path key = directory_ / "munge.key";
    std::ifstream random_source("/dev/urandom", std::ios::binary);
    std::array<char, 128> bytes{};
    random_source.read(bytes.data(), bytes.size());
    if (!random_source) throw std::runtime_error("cannot read /dev/urandom for the munge key");
    std::ofstream out(key, std::ios::binary);
    out.write(bytes.data(), bytes.size());
    out.close();
    fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write);
  }

  void write_slurm_conf(int first_port) const {
    const fs::path& d = directory_;
    std::ofstream conf(slurm_conf());
    conf << "# Written by tests/e2e/slurm_test_cluster.hpp: a private two-node cluster.\n"
         << "ClusterName=launchertest\n"
         << "SlurmctldHost=localhost\n"
         << "SlurmctldPort=" << first_port << "\n"
         << "SlurmUser=root\n"
         << "SlurmdUser=root\n"
         << "AuthType=auth/munge\n"
         << "CredType=cred/munge\n"
         << "AuthInfo=socket=" << munge_socket().string() << "\n"
         << "ProctrackType=proctrack/linuxproc\n"
         << "TaskPlugin=task/none\n"
         << "JobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\n"
         << "JobCompType=jobcomp/none\n"
         << "SelectType=select/cons_tres\n"
         << "SelectTypeParameters=CR_Core\n"
         << "ReturnToService=2\n"
         << "MinJobAge=3600\n"  // finished jobs stay visible to scontrol for the test
         << "SchedulerParameters=batch_sched_delay=0\n"  // start batch jobs now, not within 3 s
         << "KillWait=2\n"
         << "InactiveLimit=0\n"
         << "MailProg=/bin/true\n"
         << "StateSaveLocation=" << (d / "state").string() << "\n"
         << "SlurmctldPidFile=" << (d / "slurmctld.pid").string() << "\n"
         << "SlurmctldLogFile=" << (d / "slurmctld.log").string() << "\n"
         << "SlurmdSpoolDir=" << (d / "spool-%n").string() << "\n"
         // One TmpFS per node: srun --mpi=pmix makes its directories under it, named by job
         // and step only, so two nodes on one machine would collide in a shared /tmp.
         << "TmpFS=" << (d / "tmp-%n").string() << "\n"
         << "SlurmdPidFile=" << (d / "slurmd-%n.pid").string() << "\n"
         << "SlurmdLogFile=" << (d / "slurmd-%n.log").string() << "\n"
         << "NodeName=node[1-" << kNodes << "] NodeHostname=localhost Port=" << first_port + 1 << "-"
         << first_port + kNodes << " CPUs=1 RealMemory=1000\n"
         << "PartitionName=debug Nodes=node[1-" << kNodes << "] Default=YES MaxTime=INFINITE State=UP\n";
    if (!conf) throw std::runtime_error("cannot write " + slurm_conf().string());
  }

  // Polls `check` every 100 ms until it holds, `daemon` dies, or `timeout` passes.
  template <typename Check>
  bool wait_until(Check&& check, std::chrono::milliseconds timeout, std::vector<Daemon*> daemons) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (check()) return true;
      for (Daemon* daemon : daemons) {
        if (!daemon->alive()) return false;
      }
      std::this_thread::sleep_for(100ms);
    }
    return check();
  }

  void start_munged() {
    write_munge_key();
    const fs::path& d = directory_;
    munged_ = start_daemon(
        "munged",
        {program("munged"), "--foreground", "--force", "--socket=" + munge_socket().string(),
         "--key-file=" + (d / "munge.key").string(), "--pid-file=" + (d / "munged.pid").string(),
         "--seed-file=" + (d / "munged.seed").string(), "--log-file=" + (d / "munged.log").string()},
        {}, d / "munged.out");
    if (!wait_until([&] { return fs::exists(munge_socket()); }, 10s, {&munged_})) {
      throw std::runtime_error("munged did not create its socket " + munge_socket().string() +
                               " within 10 s\n" + diagnostics());
    }
  }

  // One try at slurmctld + slurmd on freshly picked ports. False when a port was taken.
  bool start_slurm_daemons() {
    first_port_ = pick_free_port_block(1 + kNodes);
    const fs::path& d = directory_;
    for (const char* sub : {"state", "spool-node1", "spool-node2"}) {
      fs::remove_all(d / sub);
      fs::create_directories(d / sub);
    }
    for (const auto& entry : fs::directory_iterator(d)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("slurm")) fs::remove(entry.path());  // logs of a lost try
    }
    write_slurm_conf(first_port_);
    for (int node = 1; node <= kNodes; ++node) {
      fs::create_directories(d / ("tmp-node" + std::to_string(node)));
    }
    const std::vector<std::string> env = environment();
    controller_ = start_daemon("slurmctld", {program("slurmctld"), "-D", "-c", "-f", slurm_conf().string()},
                               env, d / "slurmctld.out");
    const bool controller_up = wait_until(
        [&] { return client("scontrol", {"ping"}, 10s).output.find("is UP") != std::string::npos; },
        15s, {&controller_});
    if (!controller_up) return false;
    for (int node = 1; node <= kNodes; ++node) {
      const std::string name = "node" + std::to_string(node);
      nodes_.push_back(start_daemon("slurmd " + name,
                                    {program("slurmd"), "-D", "-N", name, "-f", slurm_conf().string()},
                                    env, d / ("slurmd-" + name + ".out")));
    }
    std::vector<Daemon*> watched = {&controller_};
    for (auto& node : nodes_) watched.push_back(&node);
    return wait_until(
        [&] {
          const std::string shown = client("sinfo", {"-h", "-N", "-o", "%N %T"}, 10s).output;
          int idle = 0;
          for (size_t at = shown.find(" idle"); at != std::string::npos; at = shown.find(" idle", at + 1)) {
            ++idle;
          }
          return idle == kNodes;
        },
        30s, watched);
  }

  void stop_slurm_daemons(std::chrono::milliseconds grace) {
    for (auto& node : nodes_) node.stop(grace);
    controller_.stop(grace);
    nodes_.clear();
  }

  bool lost_a_port_race() const {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(directory_, error)) {
      if (read_text(entry.path()).find("Address already in use") != std::string::npos) return true;
    }
    return false;
  }

  void start() {
    start_munged();
    for (int attempt = 1;; ++attempt) {
      if (start_slurm_daemons()) return;
      const bool port_taken = lost_a_port_race();
      const std::string logs = diagnostics();
      stop_slurm_daemons(0ms);
      if (!port_taken || attempt == 3) {
        throw std::runtime_error("the Slurm test cluster in " + directory_.string() +
                                 " did not come up (slurmctld answering `scontrol ping`, then " +
                                 std::to_string(kNodes) + " idle nodes in sinfo) on attempt " +
                                 std::to_string(attempt) + "; daemon logs:\n" + logs);
      }
    }
  }

  void shut_down() {
    if (controller_.alive()) {
      // Cancel what is left so no job step lingers, then stop the daemons the Slurm way.
      const passwd* user = getpwuid(geteuid());
      client("scancel", {"--quiet", "--user", user ? user->pw_name : "root"}, 10s);
      const auto deadline = Clock::now() + 5s;
      while (Clock::now() < deadline) {
        const CommandResult queue = client("squeue", {"-h", "-o", "%i"}, 10s);
        if (queue.exit_code != 0 || queue.output.find_first_not_of(" \n") == std::string::npos) break;
        std::this_thread::sleep_for(200ms);
      }
      client("scontrol", {"shutdown"}, 10s);
    }
    stop_slurm_daemons(5000ms);
    munged_.stop(0ms);
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
  pid_t guard_pid_ = -1;
  int guard_pipe_ = -1;  // the write end the guard waits on
  int first_port_ = 0;
  Daemon munged_;
  Daemon controller_;
  std::vector<Daemon> nodes_;
};

}  // namespace slurm_test
