// Test support for the end-to-end suites that start the real executables themselves (to kill
// them, or to run two at once): start a process with its output in a log file and a changed
// environment, and wait for it. posix_spawn, so no test thread's state leaks
// into the child beyond the descriptors it inherits.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace test_support {

// Starts argv (argv[0] a path) with stdout and stderr into `log` (truncated), in this
// process's environment changed by `environment_changes`: "NAME=value" sets NAME, a bare
// "NAME" removes it. Returns the pid.
inline pid_t spawn_process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                           const std::vector<std::string>& environment_changes = {}) {
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string entry = *variable;
    bool changed = false;
    for (const auto& change : environment_changes) changed |= name_of(change) == name_of(entry);
    if (!changed) environment.push_back(entry);
  }
  for (const auto& change : environment_changes) {
    if (change.find('=') != std::string::npos) environment.push_back(change);
  }
  std::vector<char*> environment_pointers;
  for (auto& variable : environment) environment_pointers.push_back(variable.data());
  environment_pointers.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> pointers;
  for (const auto& word : argv) pointers.push_back(const_cast<char*>(word.c_str()));
  pointers.push_back(nullptr);
  pid_t pid = -1;
  const int status = posix_spawn(&pid, pointers[0], &actions, nullptr, pointers.data(),
                                 environment_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(status == 0);
  return pid;
}

// Waits for `pid`: its exit code, or 128 + the signal that ended it (as a shell reports it).
inline int wait_for_exit(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace test_support
