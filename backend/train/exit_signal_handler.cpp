// See exit_signal_handler.hpp.
#include "backend/train/exit_signal_handler.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace backend {

namespace {

// Lock-free, so the handler's store is async-signal-safe.
std::atomic<bool> signal_received{false};
std::atomic<bool> handler_installed{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void note_exit_signal(int) {
  signal_received.store(true);
}

}  // namespace

std::optional<int> exit_signal_number(std::string_view name) {
  constexpr std::pair<std::string_view, int> kSignals[] = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  for (const auto& [known, number] : kSignals) {
    if (known == name) return number;
  }
  return std::nullopt;
}

ExitSignalHandler::ExitSignalHandler(int signal_number) : signal_number_(signal_number) {
  if (handler_installed.exchange(true)) {
    throw std::logic_error("ExitSignalHandler: one already exists in this process");
  }
  signal_received.store(false);
  struct sigaction action {};
  action.sa_handler = note_exit_signal;
  sigemptyset(&action.sa_mask);
  // Restarted system calls: a read or a collective that the signal interrupts goes on.
  action.sa_flags = SA_RESTART;
  if (sigaction(signal_number_, &action, &previous_) != 0) {
    handler_installed.store(false);
    throw std::runtime_error("sigaction(" + std::to_string(signal_number_) +
                             "): " + std::strerror(errno));
  }
}

ExitSignalHandler::~ExitSignalHandler() {
  sigaction(signal_number_, &previous_, nullptr);
  handler_installed.store(false);
}

bool ExitSignalHandler::received() const {
  return signal_received.load();
}

}  // namespace backend
