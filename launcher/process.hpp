// Running child processes without a shell: argv vectors go to execvp as they are, so nothing
// is ever re-parsed by /bin/sh. Used to submit jobs (sbatch) and to run local job scripts
// with their output streamed to the terminal and to a log file at once, as `tee` would.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace launcher {

// The absolute path of `program` found on $PATH, if any.
std::optional<std::filesystem::path> find_on_path(std::string_view program);

struct CapturedRun {
  int exit_code = 0;    // 128 + signal when killed by a signal
  std::string output;   // stdout and stderr together
};

// Runs argv to completion and captures its output. A program that cannot be started is a
// common::Error naming it.
CapturedRun run_and_capture(const std::vector<std::string>& argv);

struct TeedRun {
  int exit_code = 0;       // 128 + signal when killed by a signal
  bool timed_out = false;  // stopped because it ran past the time limit
  int interrupted_by = 0;  // with a time limit: the stop signal the launcher received and
                           // passed on to the job's group (SIGINT, SIGTERM, SIGHUP), or 0
};

// Starts argv, calls `log_file_for(pid)` to name the log, then copies the child's stdout and
// stderr to both `terminal` and that file until it exits. With a time limit the child leads
// its own process group (stdin from /dev/null: outside the terminal's foreground group a read
// would stop it), and when the limit passes the whole group (a job script, its mpirun
// and the ranks) gets SIGTERM, then SIGKILL 5 s later, as Slurm ends a job past its --time.
// Being in a group of its own, such a job would miss the terminal's Ctrl-C: while it runs, a
// SIGINT, SIGTERM or SIGHUP sent to this process is passed on to the job's group instead (then
// SIGKILL 5 s later) and named in `interrupted_by`; the caller should then stop_by_signal.
TeedRun run_and_tee(const std::vector<std::string>& argv,
                    const std::function<std::filesystem::path(int pid)>& log_file_for,
                    std::ostream& terminal,
                    std::optional<std::chrono::milliseconds> time_limit = std::nullopt);

// Ends this process by `signal` with its default action (after flushing the log), as the
// signal would have without a handler: the shell sees the usual 128 + signal.
[[noreturn]] void stop_by_signal(int signal);

// Starts argv in a new session (setsid), stdin from /dev/null, and returns its pid without
// waiting: the process outlives the launcher.
int start_detached(const std::vector<std::string>& argv);

}  // namespace launcher
